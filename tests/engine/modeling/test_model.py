import itertools

import numpy as np
import pytest
import torch

from biencoder.engine.config.heads import head_spec
from biencoder.engine.config.schema import FUSIONS
from biencoder.engine.modeling.encoding import Encoding, TokenizedTexts, encode, pair_margins
from biencoder.engine.modeling.head import FUSION_PARTS, head_statistics, head_statistics_vector
from biencoder.engine.modeling.model import BiModel, Embeddings
from conftest import compose_cfg


def make_model(encoder, fusion="concat", ln=False, relu=False, pooling="pooler", **head):
    torch.manual_seed(0)
    spec = head_spec({"use_layernorm": ln, "use_relu": relu, **head})
    return BiModel(encoder, sim_dim=128, pooling=pooling, fusion=fusion, head=spec)


@pytest.mark.parametrize(
    "fusion, ln, relu", list(itertools.product(["concat", "sim", "cls"], [False, True], [False, True]))
)
def test_shapes_for_every_fusion_and_flag(tiny_model_and_tokenizer, fusion, ln, relu):
    base, tokenizer = tiny_model_and_tokenizer
    model = make_model(base.encoder, fusion, ln, relu)
    batch = TokenizedTexts(["a short text", "another, longer piece of text", "x"], tokenizer, 16).batch([0, 1, 2])
    emb = model.embed(**batch)
    hidden = base.encoder.config.hidden_size
    assert emb.sim.shape == (3, 128) and emb.pooled.shape == (3, hidden)
    features = model.head.pair_features(emb, emb.index([2, 0, 1]))
    assert features.shape[1] == {"concat": 3 * 128 + 3 * hidden, "sim": 3 * 128, "cls": 3 * hidden}[fusion]
    assert model.head.classify_pair(emb, emb).shape == (3, 2)
    assert isinstance(model.head.norm, torch.nn.LayerNorm) == ln and isinstance(model.head.act, torch.nn.ReLU) == relu


@pytest.mark.parametrize("fusion", FUSIONS)
def test_gathered_pair_features_are_the_pair_features(tiny_model_and_tokenizer, fusion):
    """The rerank's in-place gather (a buffer larger than the block, as for the last block) writes the same values
    in the same places as pair_features."""
    assert set(FUSION_PARTS) == set(FUSIONS)
    model = make_model(tiny_model_and_tokenizer[0].encoder, fusion)
    torch.manual_seed(3)
    emb = Embeddings(torch.randn(7, 128), torch.randn(7, 32))
    a, b = torch.tensor([0, 6, 2, 2]), torch.tensor([5, 1, 2, 3])
    head = model.head
    buffer = torch.full((6, head.n_features), float("nan"))
    gathered = head.gather_pair_features(emb, a, b, buffer)
    assert gathered.shape == (4, head.n_features) and gathered.data_ptr() == buffer.data_ptr()
    assert torch.equal(gathered, head.pair_features(emb.index(a), emb.index(b)))
    assert buffer[4:].isnan().all()  # nothing written past the block
    with pytest.raises(ValueError, match="cannot hold"):
        head.gather_pair_features(emb, a, b, buffer[:3])


def test_layernorm_changes_forward_and_normalises(tiny_model_and_tokenizer):
    base, _ = tiny_model_and_tokenizer
    plain, ln = make_model(base.encoder), make_model(base.encoder, ln=True)
    ln.head.out.load_state_dict(plain.head.out.state_dict())
    ln.sim_head.load_state_dict(plain.sim_head.state_dict())
    torch.manual_seed(1)
    a = Embeddings(torch.randn(5, 128) * 3 + 2, torch.randn(5, 32) * 5)
    b = Embeddings(torch.randn(5, 128), torch.randn(5, 32))
    assert not torch.allclose(plain.head.classify_pair(a, b), ln.head.classify_pair(a, b))
    _, head_input, _ = ln.head(ln.head.pair_features(a, b))
    assert torch.allclose(head_input.mean(1), torch.zeros(5), atol=1e-5)
    assert torch.allclose(head_input.var(1, unbiased=False), torch.ones(5), atol=1e-3)


def test_relu_clamps(tiny_model_and_tokenizer):
    base, _ = tiny_model_and_tokenizer
    relu = make_model(base.encoder, relu=True)
    ln_relu = make_model(base.encoder, ln=True, relu=True)
    features = torch.randn(4, relu.head.n_features)
    for model in (relu, ln_relu):
        _, head_input, _ = model.head(features)
        assert (head_input >= 0).all() and (head_input == 0).any()
    assert torch.equal(relu.head(features)[1], features.clamp(min=0))
    _, plain_input, _ = make_model(base.encoder).head(features)
    assert torch.equal(plain_input, features)


@pytest.mark.slow
def test_the_four_variant_configs_build_four_different_heads(tiny_model_and_tokenizer):
    from biencoder.engine.modeling.model import build_model

    heads = {}
    for variant in ("ln_relu", "ln", "relu", "plain"):
        model, _ = build_model(compose_cfg(["model=tiny", f"+variant={variant}"]).model)
        heads[variant] = [name for name, _ in model.head.named_children()]
        heads[variant] += [type(model.head.norm).__name__, type(model.head.act).__name__]
    assert heads == {
        "ln_relu": ["hidden", "norm", "act", "out", "LayerNorm", "ReLU"],
        "ln": ["hidden", "norm", "out", "LayerNorm", "NoneType"],
        "relu": ["hidden", "act", "out", "NoneType", "ReLU"],
        "plain": ["hidden", "out", "NoneType", "NoneType"],
    }


def test_poolings_differ_and_mean_ignores_padding(tiny_model_and_tokenizer):
    base, tokenizer = tiny_model_and_tokenizer
    tokens = TokenizedTexts(["one two three", "one two three four five six seven"], tokenizer, 32)
    pooled = {
        p: make_model(base.encoder, pooling=p).eval().embed(**tokens.batch([0, 1])).pooled
        for p in ("pooler", "cls", "mean")
    }
    assert not torch.allclose(pooled["cls"], pooled["mean"]) and not torch.allclose(pooled["cls"], pooled["pooler"])
    alone = make_model(base.encoder, pooling="mean").eval().embed(**tokens.batch([0])).pooled
    assert torch.allclose(alone[0], pooled["mean"][0], atol=1e-5)  # padding in the 2-row batch changes nothing


def test_encode_is_batch_size_and_order_independent(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    texts = [f"text number {i} " + "word " * (i % 7) for i in range(23)]
    tokens = TokenizedTexts(texts, tokenizer, 32)
    one = encode(model, tokens, Encoding(batch_size=1))
    many = encode(model, tokens, Encoding(batch_size=8))
    assert torch.allclose(one.sim, many.sim, atol=1e-5) and torch.allclose(one.pooled, many.pooled, atol=1e-5)
    direct = model.eval().embed(**tokens.batch([5]))
    assert torch.allclose(direct.sim[0], many.sim[5], atol=1e-5)


@pytest.mark.parametrize("batch_size", [1, 2, 5, 64])
def test_pair_margins_are_classify_pairs_margins_to_the_bit(tiny_model_and_tokenizer, batch_size):
    """The same blocks through classify_pair give the same margins bit for bit (a partial last block, one block larger
    than the pairs, and no pairs included)."""
    model = make_model(tiny_model_and_tokenizer[0].encoder, ln=True, relu=True).eval()
    torch.manual_seed(2)
    emb = Embeddings(torch.randn(10, 128), torch.randn(10, 32))
    a, b = np.array([0, 1, 2, 3, 9]), np.array([5, 5, 6, 7, 0])
    with torch.no_grad():
        logits = torch.cat(
            [
                model.head.classify_pair(emb.index(a[i : i + batch_size]), emb.index(b[i : i + batch_size]))
                for i in range(0, len(a), batch_size)
            ]
        )
    margins = pair_margins(model, emb, a, b, batch_size=batch_size)
    assert margins.dtype == np.float32 and np.array_equal(margins, (logits[:, 1] - logits[:, 0]).numpy())
    assert pair_margins(model, emb, a[:0], b[:0], batch_size=batch_size).shape == (0,)


def test_head_statistics_by_hand():
    pre = torch.tensor([[1.0, 3.0], [-2.0, 2.0]])
    post = pre.clamp(min=0)
    stats = {k: v.item() for k, v in head_statistics(pre, post).items()}
    assert stats["head_pre_sample_mean"] == pytest.approx(1.0)  # means 2 and 0
    assert stats["head_pre_sample_var"] == pytest.approx(2.5)  # variances 1 and 4
    assert stats["head_post_zero_share"] == pytest.approx(0.25)
    assert stats["head_pre_zero_share"] == 0.0


def test_embeddings_index_equals_advanced_indexing():
    """index_select (faster on a CPU) gives the rows tensor[rows] gives: repeats, any order, numpy or list or empty."""
    torch.manual_seed(4)
    emb = Embeddings(torch.randn(9, 5), torch.randn(9, 7).t().contiguous().t())  # pooled not contiguous
    for rows in (np.array([8, 0, 0, 3, 8]), [2, 1], np.array([], dtype=np.int64), torch.tensor([4, 4])):
        picked, expected = emb.index(rows), torch.as_tensor(np.asarray(rows), dtype=torch.long)
        assert torch.equal(picked.sim, emb.sim[expected]) and torch.equal(picked.pooled, emb.pooled[expected])


@pytest.mark.parametrize("every, sampled", [(8, [0, 8, 16]), (1, list(range(19))), (20, [0])])
def test_epoch_sums_sample_the_step_statistics_and_average_the_loss_over_every_step(every, sampled):
    """EpochSums: the loss parts are means over all 19 steps; the step statistics (head statistics and gradient
    norms) are the mean of the first step of every ``every`` (trainer.stats_every), to the bit, and are computed on
    those steps only. The other steps' head tensors are far off (x 1000), so counting one of them would show."""
    from biencoder.engine.training.epoch import STEP_STATISTICS, EpochSums

    torch.manual_seed(3)
    sums, total, computed = EpochSums(every=every), None, []
    for step in range(19):
        batch = 10 if step == 18 else 16  # a smaller last batch
        features = (torch.randn(batch, 40) * 2 + step) * (1 if step in sampled else 1000)
        head_input = torch.relu(torch.nn.functional.layer_norm(features, (40,)))
        row = torch.cat([head_statistics_vector(features, head_input), torch.tensor([0.0, 1.0 + step])])
        sums.add({"loss": torch.tensor(float(step))}, lambda step=step, row=row: computed.append(step) or row.clone())
        if step in sampled:
            total = row.clone() if total is None else total.add_(row)
    assert computed == sampled
    means = sums.means()
    assert means["loss"] == sum(range(19)) / 19
    assert [means[name] for name in STEP_STATISTICS] == [v / len(sampled) for v in total.tolist()]


def test_epoch_sums_refuse_step_statistics_that_their_names_do_not_match():
    """A step statistic computed but not named (a [13] row for the 14 STEP_STATISTICS, or 15) is an error when the
    means are read, not a metrics row that silently lacks the unnamed values or names them wrongly."""
    from biencoder.engine.training.epoch import STEP_STATISTICS, EpochSums

    for size in (len(STEP_STATISTICS) - 1, len(STEP_STATISTICS) + 1):
        sums = EpochSums(every=1)
        sums.add({"loss": torch.tensor(1.0)}, lambda size=size: torch.zeros(size))
        with pytest.raises(ValueError, match="zip"):
            sums.means()


def test_eval_mode_switches_every_module_and_restores_the_model(tiny_model_and_tokenizer):
    """Inside eval_mode every module is in eval mode, whatever the model's state; a model in eval mode throughout is
    not switched (nor back) at all, and a model that was switched is restored as before (train(was_training))."""
    import copy

    from biencoder.engine.modeling.encoding import eval_mode

    model = make_model(copy.deepcopy(tiny_model_and_tokenizer[0].encoder))  # the session's model keeps its mode
    switches = []
    model.train = lambda mode=True, _train=model.train: (switches.append(mode), _train(mode))[1]
    model.train(), model.encoder.train(False)  # training with a frozen encoder: mixed
    switches.clear()
    with eval_mode(model):
        assert not any(m.training for m in model.modules()) and not torch.is_grad_enabled()
    assert model.training and switches == [False, True]
    model.eval(), model.sim_head.train()  # top level in eval mode, one submodule not
    with eval_mode(model):
        assert not model.sim_head.training
    model.train()
    with pytest.raises(KeyError):  # an error inside restores the mode too
        with eval_mode(model):
            raise KeyError("x")
    assert all(m.training for m in model.modules())
    model.eval()
    switches.clear()
    with eval_mode(model):  # in eval mode throughout: left alone
        with eval_mode(model):
            pass
    assert switches == [] and not any(m.training for m in model.modules())


def test_pooled_vectors_refuse_non_finite_vectors_with_or_without_a_cache(tiny_model_and_tokenizer, tmp_path):
    """The runner trusts a frozen encoder's pooled vectors to be finite (it checks only the sim vectors per epoch):
    pooled_vectors guarantees it without a cache too, as the cache does, with one line a person can act on."""
    import copy

    from biencoder.engine.modeling.encoding import TextEncoder, pooled_vectors
    from biencoder.errors import BiencoderError

    model, tokenizer = tiny_model_and_tokenizer
    broken = copy.deepcopy(model)
    with torch.no_grad():
        broken.encoder.embeddings.word_embeddings.weight.fill_(float("nan"))
    assert torch.isfinite(pooled_vectors(TextEncoder(model, tokenizer, 16), ["a point", "a counter"])).all()
    for cache_dir in (None, tmp_path / "cache"):  # without a cache, and with one (nothing is written to it)
        with pytest.raises(BiencoderError, match="non-finite pooled vectors.*trainer.precision=fp32"):
            pooled_vectors(TextEncoder(broken, tokenizer, 16, cache_dir=cache_dir), ["a point", "a counter"])
    assert not list((tmp_path / "cache").rglob("*.npz"))


def test_the_mask_decided_on_the_host_gives_the_same_outputs_without_a_sync(tiny_model_and_tokenizer):
    """BiModel.pool with ``padded`` (from the host's token lengths) builds the mask transformers would build from the
    2-D one (None, or the 4-D padding mask), so the pooled outputs are the same to the bit, padded batch or not, in
    train and eval mode; and the forward reads nothing back (transformers' own check calls ``mask.all()``)."""
    from biencoder.engine.modeling.model import encoder_mask

    model, tokenizer = tiny_model_and_tokenizer
    assert model.encoder.config._attn_implementation == "sdpa"
    texts = TokenizedTexts(
        [
            "a short one",
            "a much longer text than the short one, with more words in it",
            "two",
            "and a fourth text of middling length",
        ],
        tokenizer,
        32,
    )
    reads = []
    original = torch.Tensor.all  # each patch below is undone when its block ends
    for rows in ([0, 1, 2, 3], [1, 1], [2, 2, 2]):
        batch = texts.batch(rows)
        assert batch["padded"] == (len(set(texts.lengths[rows])) > 1)
        for training in (False, True):
            model.train(training)
            torch.manual_seed(1)  # the same dropout masks for both calls
            with torch.no_grad():
                plain = model.pool(batch["input_ids"], batch["attention_mask"])
            torch.manual_seed(1)
            with torch.no_grad(), pytest.MonkeyPatch.context() as patch:
                patch.setattr(torch.Tensor, "all", lambda self, *a, **k: reads.append(1) or original(self, *a, **k))
                decided = model.pool(**batch)
            assert torch.equal(plain, decided), (rows, training)
    model.eval()
    assert reads == []
    with torch.no_grad(), pytest.MonkeyPatch.context() as patch:  # the check this replaces: transformers' own read
        patch.setattr(torch.Tensor, "all", lambda self, *a, **k: reads.append(1) or original(self, *a, **k))
        model.pool(batch["input_ids"], batch["attention_mask"])
    assert reads
    mask = texts.batch([0, 1])["attention_mask"]
    assert encoder_mask(model.encoder, mask, None) is mask and encoder_mask(model.encoder, mask, False) is None
    assert encoder_mask(model.encoder, mask, True).shape == (2, 1, mask.shape[1], mask.shape[1])


SMALL = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "vocab_size": 100,
    "max_position_embeddings": 64,
}
SMALL_CONFIGS = {
    "bert": SMALL,
    "roberta": SMALL,
    "xlm-roberta": SMALL,
    "electra": SMALL,
    "albert": {**SMALL, "embedding_size": 16},
    "distilbert": {
        "dim": 32,
        "n_layers": 2,
        "n_heads": 2,
        "hidden_dim": 64,
        "vocab_size": 100,
        "max_position_embeddings": 64,
    },
    "modernbert": {
        **SMALL,
        "global_attn_every_n_layers": 2,
        "local_attention": 4,
        "pad_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "cls_token_id": 1,
        "sep_token_id": 2,
    },
    "bert as a decoder": {**SMALL, "is_decoder": True},
}


@pytest.mark.parametrize("kind", list(SMALL_CONFIGS))
def test_the_host_mask_is_used_only_where_it_gives_the_same_outputs(kind):
    """Each model type of HOST_MASK_MODEL_TYPES gives bit for bit the outputs of the 2-D mask on a padded batch;
    ModernBERT (sliding-window layers) and a BERT decoder (causal mask) would not, so they keep the 2-D mask."""
    from transformers import AutoConfig, AutoModel

    from biencoder.engine.modeling.model import HOST_MASK_MODEL_TYPES, encoder_mask

    model_type = kind.split()[0]
    torch.manual_seed(0)
    encoder = AutoModel.from_config(AutoConfig.for_model(model_type, **SMALL_CONFIGS[kind]))
    model = BiModel(encoder, sim_dim=8, pooling="mean").eval()
    lengths = torch.tensor([12, 5, 9, 12])
    mask = (torch.arange(12)[None, :] < lengths[:, None]).long()
    ids = torch.randint(5, 100, (4, 12)) * mask
    host = encoder_mask(encoder, mask, True)
    if kind in HOST_MASK_MODEL_TYPES:
        assert host.shape == (4, 1, 12, 12)
    else:
        assert host is mask
    with torch.no_grad():
        assert torch.equal(model.pool(ids, mask), model.pool(ids, mask, True))


def test_pca_init_projects_on_the_principal_components(tiny_model_and_tokenizer):
    """model.sim_init=pca: sim(x) = V_k^T (x - mean), i.e. sklearn's PCA transform up to the sign of each
    component; with sim_dim >= hidden every distance between the vectors it was fit on is kept exactly."""
    import copy

    from sklearn.decomposition import PCA

    model = copy.deepcopy(tiny_model_and_tokenizer[0])  # hidden 32, sim_dim 128
    x = torch.randn(200, 32, generator=torch.Generator().manual_seed(0)) * torch.linspace(3, 0.1, 32)
    model.init_sim_from_pca(x)
    with torch.no_grad():
        sim = model.sim_head(x)
    assert torch.allclose(torch.cdist(sim.double(), sim.double()), torch.cdist(x.double(), x.double()), atol=1e-4)
    assert (model.sim_head.weight[32:] == 0).all()  # beyond the data's rank: zero rows

    small = BiModel(model.encoder, sim_dim=4)
    small.init_sim_from_pca(x)
    with torch.no_grad():
        sim = small.sim_head(x).numpy()
    expected = PCA(n_components=4).fit_transform(x.numpy().astype(np.float64))
    assert np.allclose(np.abs(sim), np.abs(expected), atol=1e-4)
