"""The frozen-encoder embedding cache: keying, corruption, staleness, and frozen training that never runs the
encoder."""

import logging

import numpy as np
import pytest
import torch

from biencoder.engine.inference.evaluation import run_evaluation
from biencoder.engine.modeling.cache import EmbeddingCache, encoder_fingerprint
from biencoder.engine.modeling.encoding import TextEncoder, TokenizedTexts, encode_pooled, pooled_vectors
from biencoder.engine.modeling.model import build_model
from biencoder.engine.training.runner import Runner
from conftest import FAST, compose_cfg

TEXTS = ["a point about schools", "a counter about schools", "a point about taxes", "a counter about taxes"]


class CountingCompute:
    """compute(rows) for EmbeddingCache.get: a deterministic vector per text, and a record of what was asked."""

    def __init__(self, texts):
        self.texts, self.calls = texts, []

    def __call__(self, rows):
        self.calls.append(list(rows))
        return np.array([[len(self.texts[r]), sum(map(ord, self.texts[r])) % 97, r] for r in rows], dtype=np.float32)


def lookup(
    tmp_path, texts=TEXTS, fingerprint="f" * 64, pooling="mean", max_length=128, precision="fp32", tokenizer="t" * 64
):
    cache = EmbeddingCache(tmp_path, fingerprint, tokenizer, pooling, max_length, precision)
    compute = CountingCompute(texts)
    return cache, compute, cache.get(texts, compute)


def test_second_lookup_is_served_from_disk(tmp_path):
    cache, compute, first = lookup(tmp_path)
    assert compute.calls == [[0, 1, 2, 3]] and (cache.hits, cache.misses) == (0, 4)
    cache, compute, second = lookup(tmp_path)
    assert compute.calls == [] and (cache.hits, cache.misses) == (4, 0)
    np.testing.assert_array_equal(first, second)
    # a subset, in another order, is served too
    cache, compute, part = lookup(tmp_path, texts=[TEXTS[3], TEXTS[0]])
    assert compute.calls == [] and part[0][0] == len(TEXTS[3])


@pytest.mark.parametrize(
    "change",
    [
        {"fingerprint": "e" * 64},
        {"max_length": 64},
        {"pooling": "cls"},
        {"precision": "bf16"},
        {"tokenizer": "u" * 64},
    ],
)
def test_changed_model_tokenizer_max_length_pooling_or_precision_misses(tmp_path, change):
    lookup(tmp_path)
    cache, compute, _ = lookup(tmp_path, **change)
    assert compute.calls == [[0, 1, 2, 3]], change


def test_changed_text_misses_only_that_text(tmp_path):
    lookup(tmp_path)
    edited = TEXTS[:2] + [TEXTS[2] + "!"] + TEXTS[3:]
    cache, compute, vectors = lookup(tmp_path, texts=edited)
    assert compute.calls == [[2]] and vectors[2][0] == len(edited[2])


def test_duplicate_texts_are_computed_once(tmp_path):
    cache, compute, vectors = lookup(tmp_path, texts=["same", "other", "same"])
    assert compute.calls == [[0, 1]]
    np.testing.assert_array_equal(vectors[0], vectors[2])


def test_corrupt_shard_is_deleted_and_recomputed(tmp_path, caplog):
    cache, _, first = lookup(tmp_path)
    (shard,) = cache.folder.glob("*.npz")
    shard.write_bytes(shard.read_bytes()[:100])  # torn file
    with caplog.at_level(logging.WARNING, logger="biencoder"):
        cache, compute, again = lookup(tmp_path)
    assert compute.calls == [[0, 1, 2, 3]] and "cannot be read" in caplog.text
    np.testing.assert_array_equal(first, again)
    assert len(list(cache.folder.glob("*.npz"))) == 1  # the torn one is gone, the new one is there


def test_tampered_vectors_fail_the_checksum(tmp_path, caplog):
    cache, _, first = lookup(tmp_path)
    (shard,) = cache.folder.glob("*.npz")
    with np.load(shard) as data:
        parts = dict(data)
    parts["vectors"] = parts["vectors"] + 1.0  # readable, plausible, wrong
    with open(shard, "wb") as file:
        np.savez(file, **parts)
    with caplog.at_level(logging.WARNING, logger="biencoder"):
        cache, compute, again = lookup(tmp_path)
    assert compute.calls == [[0, 1, 2, 3]] and "checksum" in caplog.text
    np.testing.assert_array_equal(first, again)


def test_stale_shard_is_not_used(tmp_path, caplog):
    """A shard whose recorded key differs from its folder's (e.g. copied in by hand) is stale."""
    cache, _, _ = lookup(tmp_path)
    other, _, _ = lookup(tmp_path / "other", max_length=64)
    (shard,) = other.folder.glob("*.npz")
    for old in cache.folder.glob("*.npz"):
        old.unlink()
    shard.rename(cache.folder / shard.name)
    with caplog.at_level(logging.WARNING, logger="biencoder"):
        _, compute, _ = lookup(tmp_path)
    assert compute.calls == [[0, 1, 2, 3]] and "stale" in caplog.text


def test_unwritable_cache_dir_is_a_clear_error(tmp_path):
    from biencoder.engine.modeling.cache import CacheError

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(CacheError, match="trainer.cache_dir"):
        lookup(blocker)


@pytest.mark.slow
def test_fingerprint_tells_weights_apart():
    cfg = compose_cfg(["model=tiny"]).model
    torch.manual_seed(0)
    a, _ = build_model(cfg, progress=False)
    torch.manual_seed(0)
    b, _ = build_model(cfg, progress=False)
    assert encoder_fingerprint(a.encoder) == encoder_fingerprint(b.encoder)
    with torch.no_grad():
        b.encoder.embeddings.word_embeddings.weight[0, 0] += 1e-6
    assert encoder_fingerprint(a.encoder) != encoder_fingerprint(b.encoder)


@pytest.mark.slow
def test_tokenizer_fingerprint_tells_vocabularies_apart_not_paths(tmp_path, tiny_model_and_tokenizer):
    """Equal encoder weights with another vocabulary must not share cached vectors; a copied folder must."""
    from transformers import AutoTokenizer

    from biencoder.engine.modeling.cache import tokenizer_fingerprint

    _, tokenizer = tiny_model_and_tokenizer
    tokenizer.save_pretrained(tmp_path / "copy")
    copy = AutoTokenizer.from_pretrained(tmp_path / "copy")
    assert tokenizer_fingerprint(copy) == tokenizer_fingerprint(tokenizer)
    copy(["a text"], truncation=True, max_length=7)  # per-call truncation state is not part of the key
    assert tokenizer_fingerprint(copy) == tokenizer_fingerprint(tokenizer)
    copy.add_tokens(["counterargumentation"])
    assert tokenizer_fingerprint(copy) != tokenizer_fingerprint(tokenizer)
    lower = AutoTokenizer.from_pretrained(tmp_path / "copy", do_lower_case=False)
    assert tokenizer_fingerprint(lower) != tokenizer_fingerprint(tokenizer)


@pytest.mark.slow
def test_cached_vectors_equal_a_fresh_encoder_pass(tmp_path, tiny_model_and_tokenizer, demo_corpus, encoder_calls):
    """pooled_vectors: without a cache folder every text is encoded; with one, the first call encodes and fills it,
    the second reads it back without running the encoder; all three agree with a plain encoder pass."""
    model, tokenizer = tiny_model_and_tokenizer
    texts = demo_corpus.paired("val").texts
    fresh = encode_pooled(model, TokenizedTexts(texts, tokenizer, 64))
    encoder_calls.clear()
    torch.testing.assert_close(pooled_vectors(TextEncoder(model, tokenizer, 64), texts), fresh, rtol=0, atol=0)
    assert encoder_calls
    fingerprint = encoder_fingerprint(model.encoder)
    first = pooled_vectors(TextEncoder(model, tokenizer, 64, cache_dir=tmp_path, fingerprint=fingerprint), texts)
    encoder_calls.clear()
    # the fingerprint hashed here: the same key
    second = pooled_vectors(TextEncoder(model, tokenizer, 64, cache_dir=tmp_path), texts)
    assert encoder_calls == []
    torch.testing.assert_close(first, fresh, rtol=0, atol=1e-6)
    torch.testing.assert_close(second, first, rtol=0, atol=0)


# -- frozen training ------------------------------------------------------------------------------------------
FROZEN = FAST + ["model.encoder.freeze=true", "+variant=ln_relu"]


@pytest.mark.slow
def test_frozen_epoch_trains_heads_only(tmp_path, encoder_calls):
    runner = Runner(compose_cfg(FROZEN + [f"trainer.cache_dir={tmp_path / 'cache'}"]), tmp_path)
    encoder_before = {k: v.clone() for k, v in runner.model.encoder.state_dict().items()}
    # the heads named from the model itself, not from head_parameters() (what trains them is under test)
    heads_before = {
        name: p.detach().clone() for name, p in runner.model.named_parameters() if not name.startswith("encoder.")
    }
    assert set(heads_before) == {
        f"{head}.{w}" for head in ("sim_head", "head.norm", "head.out") for w in ("weight", "bias")
    }
    assert not any(p.requires_grad for p in runner.model.encoder.parameters())
    calls = encoder_calls
    calls.clear()  # building the runner filled the cache; from here on nothing may encode
    train_emb = runner.evaluation.embed("train")
    runner.trainer.train_epoch(0, runner.trainer.mine(0, train_emb.sim))
    runner.evaluate_epoch(("train", "val"))
    assert calls == []  # training, mining and evaluation all work on the cached vectors
    for key, value in runner.model.encoder.state_dict().items():
        assert torch.equal(value, encoder_before[key]), key
    unchanged = [
        name
        for name, p in runner.model.named_parameters()
        if name in heads_before and torch.equal(p, heads_before[name])
    ]
    assert unchanged == []  # the sim head, the LayerNorm and the classifier all trained


@pytest.mark.slow
def test_a_frozen_encoders_own_space_is_searched_once_per_run(tmp_path, monkeypatch):
    """eval.retrieve=encoder with a frozen encoder: the shortlists cannot change, so each split is searched once
    per run (not every epoch), and the epoch's metrics are those of a fresh search."""
    from biencoder.engine.retrieval import rerank
    from biencoder.engine.training import evaluation

    searches = []
    original = evaluation.retrieval_order  # the retrieval order, whose first k places are the shortlist
    monkeypatch.setattr(evaluation, "retrieval_order", lambda *a, **k: searches.append(1) or original(*a, **k))
    cfg = compose_cfg(FROZEN + [f"trainer.cache_dir={tmp_path / 'cache'}", "eval.retrieve=encoder"])
    runner = Runner(cfg, tmp_path / "run")
    for epoch in range(2):
        runner.trainer.train_epoch(epoch, runner.trainer.mine(epoch, runner.evaluation.embed("train").sim))
        metrics, _, embs = runner.evaluate_epoch(("train", "val", "test"), epoch)
        for name, emb in embs.items():
            settings = rerank.Rerank(cfg.eval.k, index=cfg.eval.index, space="encoder")
            fresh, _ = rerank.retrieve_rerank(
                runner.model, emb, runner.data.splits[name], settings, runner.evaluation.pairs[name]
            )
            assert {key: metrics[name][key] for key in fresh} == fresh
    assert len(searches) == 3  # one per split, in the first epoch


@pytest.mark.slow
def test_second_run_and_evaluation_never_run_the_encoder(tmp_path, encoder_calls):
    from biencoder.engine.training.run import run

    overrides = FROZEN + [f"trainer.cache_dir={tmp_path / 'cache'}"]
    first = run(compose_cfg(overrides), tmp_path / "first")
    calls = encoder_calls
    calls.clear()  # the first run encoded; from here on nothing may
    second = run(compose_cfg(overrides), tmp_path / "second")
    assert calls == [] and second["best"] == first["best"]
    evaluated = run_evaluation(
        compose_cfg(
            [
                f"trainer.cache_dir={tmp_path / 'cache'}",
                "trainer.progress=false",
                f"eval.checkpoint={tmp_path / 'first'}",
                "eval.split=test",
            ],
            "evaluate",
        ),
        tmp_path / "eval",
    )
    assert calls == []
    assert evaluated["tasks"] == first["tasks"]["test"]


@pytest.mark.slow
def test_a_resumed_frozen_run_ends_as_an_uninterrupted_one(tmp_path, monkeypatch):
    """last.pt leaves out a frozen encoder's weights; on resume the best state's encoder part comes from the model
    (checkpoint.restore_last), so a run stopped after 2 of 3 epochs and resumed writes the same best.pt, final
    numbers and TREC files as one that ran through."""
    from biencoder.engine.training.run import run

    overrides = FROZEN + [f"trainer.cache_dir={tmp_path / 'cache'}", "trainer.max_epochs=3", "trainer.device=cpu"]
    whole = run(compose_cfg(overrides), tmp_path / "whole")
    run_epoch = Runner.run_epoch

    def stopped_at_2(self, epoch, *args):
        if epoch == 2:
            raise KeyboardInterrupt  # as a Ctrl-C after epoch 1's last.pt (trainer.checkpoint_every=1)
        return run_epoch(self, epoch, *args)

    monkeypatch.setattr(Runner, "run_epoch", stopped_at_2)
    with pytest.raises(KeyboardInterrupt):
        run(compose_cfg(overrides), tmp_path / "resumed")
    assert (tmp_path / "resumed" / "last.pt").exists()
    epochs = []
    monkeypatch.setattr(
        Runner, "run_epoch", lambda self, epoch, *args: epochs.append(epoch) or run_epoch(self, epoch, *args)
    )
    resumed = run(compose_cfg(overrides + [f"trainer.resume={tmp_path / 'resumed'}"]), tmp_path / "resumed")
    assert epochs == [2]
    for key in ("best_epoch", "best", "tasks"):
        assert resumed[key] == whole[key], key
    saved = [
        torch.load(tmp_path / name / "best.pt", weights_only=False)["state_dict"] for name in ("whole", "resumed")
    ]
    assert saved[0].keys() == saved[1].keys() and all(torch.equal(saved[0][k], saved[1][k]) for k in saved[0])
    # the resumed run ranks the test queries with the best weights again (last.pt keeps no ranking): the same files
    for name in ("test.run.gz", "test.qrels"):
        assert (tmp_path / "whole" / name).read_bytes() == (tmp_path / "resumed" / name).read_bytes(), name


@pytest.mark.slow
def test_frozen_batches_carry_the_mined_negatives(tmp_path):
    """The frozen path gathers each batch from the cached vectors, not through the DataLoader: each batch must be
    exactly the cached vectors of (point, its counter, the negative mined for that point), every pair once per
    epoch."""
    runner = Runner(
        compose_cfg(FROZEN + [f"trainer.cache_dir={tmp_path / 'cache'}", "negatives.random_rate.start=0.5"]), tmp_path
    )
    split, pooled = runner.data.splits["train"], runner.inputs.pooled["train"]
    mined = runner.trainer.mine(0, runner.evaluation.embed("train").sim)
    seen = []
    for rows, inputs in runner.trainer.batches(0, mined):
        assert np.array_equal(rows[:, 1], split.counter[rows[:, 0]]) and np.array_equal(
            rows[:, 2], mined.row[rows[:, 0]]
        )
        torch.testing.assert_close(inputs["pooled"], pooled[torch.from_numpy(rows.T.ravel())], rtol=0, atol=0)
        seen.append(rows[:, 0])
    assert sorted(np.concatenate(seen)) == list(split.query)
    assert (split.text_id[mined.row] != split.text_id[split.counter]).all()  # never the positive


@pytest.mark.slow
@pytest.mark.parametrize("frozen", [True, False])
def test_a_fresh_run_starts_its_sim_head_from_pca(tmp_path, frozen):
    """model.sim_init=pca reaches the runner: at the start of a fresh run (frozen or not) the sim distances of the
    training texts are the encoder's pooled distances (sim_dim 128 >= hidden 32 keeps them all); random does not."""
    base = FAST + ["+variant=ln", f"trainer.cache_dir={tmp_path / 'cache'}", f"model.encoder.freeze={frozen}"]
    for init, kept in (("pca", True), ("random", False)):
        runner = Runner(compose_cfg(base + [f"model.sim_init={init}"]), tmp_path / init)
        _, _, train_sim = runner._start()
        pooled = runner.evaluation.embed("train").pooled.double()
        same = torch.allclose(
            torch.cdist(train_sim.double(), train_sim.double()), torch.cdist(pooled, pooled), rtol=1e-4, atol=1e-6
        )
        assert same == kept


@pytest.mark.slow
def test_a_frozen_runs_best_weights_take_the_encoder_once(tmp_path):
    """The best epoch's weights are a CPU copy of the model's heads; a frozen encoder's part is taken once per run
    and shared by later copies (it never changes). On a CPU it is the model's own tensors, not a second copy."""
    runner = Runner(compose_cfg(FROZEN + [f"trainer.cache_dir={tmp_path / 'cache'}", "trainer.device=cpu"]), tmp_path)
    first = runner._weights_on_cpu()
    runner.trainer.train_epoch(0, runner.trainer.mine(0, runner.evaluation.embed("train").sim))
    second = runner._weights_on_cpu()
    assert first.keys() == second.keys() == runner.model.state_dict().keys()
    for key, value in runner.model.state_dict().items():
        encoder = key.startswith("encoder.")
        assert torch.equal(second[key], value) and (second[key].data_ptr() == value.data_ptr()) == encoder, key
        assert (first[key] is second[key]) == encoder, key
    assert not torch.equal(first["head.out.weight"], second["head.out.weight"])  # the heads trained in between
