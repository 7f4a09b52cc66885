"""The pair head as a component (engine/modeling/head.py): what each spec builds, in which order, its train/eval
behaviour (dropout, BatchNorm), the statistics' pre/post, a component of the user's own, and the state-dict keys of
the layout before the head was ``model.head``."""

import copy
import itertools

import numpy as np
import pytest
import torch
from torch import nn

from biencoder.engine.config.heads import HeadSpec, head_spec
from biencoder.engine.modeling.encoding import pair_margins
from biencoder.engine.modeling.head import PairHead
from biencoder.engine.modeling.model import BiModel, Embeddings, renamed_head_keys
from biencoder.errors import ConfigError

SIM, WIDTH = 8, 4  # features: 3 * 8 + 3 * 4 = 36 with fusion=concat


def spec(norm="none", activation="none", dropout=0.0, hidden=()):
    return HeadSpec(norm, activation, dropout, tuple(hidden))


def make_head(seed=0, **kwargs) -> PairHead:
    torch.manual_seed(seed)
    return PairHead("concat", SIM, WIDTH, spec(**kwargs))


@pytest.mark.parametrize(
    "norm, activation",
    list(itertools.product(["none", "layernorm", "rmsnorm", "batchnorm"], ["none", "relu", "gelu", "tanh", "silu"])),
)
def test_every_norm_and_activation_builds_and_keeps_the_width(norm, activation):
    head = make_head(norm=norm, activation=activation, hidden=[16, 8])
    x = torch.randn(6, head.n_features)
    for mode in (True, False):
        head.train(mode)
        pre, post, logits = head(x)
        assert pre.shape == post.shape == (6, 8) and logits.shape == (6, 2) and torch.isfinite(logits).all()
    kinds = {"layernorm": nn.LayerNorm, "rmsnorm": nn.RMSNorm, "batchnorm": nn.BatchNorm1d}
    acts = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh, "silu": nn.SiLU}
    assert head.hidden[0].norm is None and head.hidden[0].act is None  # the first reads the features as they are
    for block in (head.hidden[1], head):  # after each hidden layer: in front of the next, and of the output layer
        assert (block.norm is None) == (norm == "none") and (block.act is None) == (activation == "none")
        assert norm == "none" or type(block.norm) is kinds[norm]
        assert activation == "none" or type(block.act) is acts[activation]


def test_each_hidden_layer_is_linear_then_norm_activation_dropout():
    """hidden=[16, 8], LayerNorm and tanh: features → Linear → LayerNorm → tanh → Linear → LayerNorm → tanh →
    output layer. ``pre`` is the last hidden layer's output (what the output layer's norm reads), ``post`` that after
    the norm and the activation. A head that put the norm and the activation in front of the first hidden layer too
    (normalising the raw features) gives other numbers."""
    head = make_head(norm="layernorm", activation="tanh", hidden=[16, 8]).eval()
    with torch.no_grad():  # non-trivial affine parameters, so that a norm left out or misplaced shows
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    x = torch.randn(5, head.n_features) * 3 + 1
    with torch.no_grad():
        h1 = head.hidden[0].linear(x)
        h2 = head.hidden[1].linear(torch.tanh(head.hidden[1].norm(h1)))
        pre, post, logits = head(x)
        torch.testing.assert_close(pre, h2)
        torch.testing.assert_close(post, torch.tanh(head.norm(h2)))
        torch.testing.assert_close(logits, head.out(torch.tanh(head.norm(h2))))
    assert [w.shape for w in (head.hidden[0].linear.weight, head.hidden[1].linear.weight, head.out.weight)] == [
        (16, 36),
        (8, 16),
        (2, 8),
    ]
    assert [k for k in head.state_dict() if not k.endswith("bias")] == [
        "hidden.0.linear.weight",
        "hidden.1.norm.weight",
        "hidden.1.linear.weight",
        "norm.weight",
        "out.weight",
    ]


@pytest.mark.parametrize("fusion", ["concat", "sim", "cls"])
def test_the_first_layer_by_its_terms_is_the_layer_over_the_features(fusion):
    """pair_outputs (training) and pair_scorer (evaluation) compute the first hidden layer as a term of a, one of b
    and one of |a − b| per part: the same outputs and gradients as forward over the concatenated features, up to
    float rounding."""
    torch.manual_seed(0)
    head = PairHead(fusion, SIM, WIDTH, spec(norm="layernorm", activation="gelu", hidden=[16, 8]))
    sim, pooled = torch.randn(10, SIM, requires_grad=True), torch.randn(10, WIDTH)
    emb = Embeddings(sim, pooled)
    rows_a, rows_b = torch.tensor([0, 3, 3, 9, 5, 1]), torch.tensor([1, 2, 7, 0, 5, 8])
    a, b = emb.index(rows_a), emb.index(rows_b)
    direct = head(head.pair_features(a, b))
    by_terms = head.pair_outputs(a, b)
    for x, y in zip(direct, by_terms, strict=True):
        torch.testing.assert_close(x, y)
    wrt = [sim, *head.parameters()] if fusion != "cls" else list(head.parameters())  # cls: the sim part unused
    grads = [torch.autograd.grad(out[2].square().sum(), wrt, retain_graph=True) for out in (direct, by_terms)]
    for x, y in zip(*grads, strict=True):
        torch.testing.assert_close(x, y)
    with torch.no_grad():
        scored = head.pair_scorer(emb, 6)(rows_a, rows_b)
        torch.testing.assert_close(scored, direct[2])
        torch.testing.assert_close(head.classify_pair(a, b), direct[2])


def test_without_hidden_layers_pre_is_the_features_and_the_weights_are_drawn_as_before():
    """The card's head: pre = the pair features; the output layer's weights are the first the head draws, as when
    LayerNorm/ReLU/out were the model's own modules (so the same seed starts from the same weights)."""
    head = make_head(seed=3, norm="layernorm", activation="relu")
    torch.manual_seed(3)
    expected = nn.Linear(36, 2)
    assert torch.equal(head.out.weight, expected.weight) and torch.equal(head.out.bias, expected.bias)
    x = torch.randn(4, 36)
    pre, post, _ = head(x)
    assert pre is x and torch.equal(post, torch.relu(head.norm(x)))


def test_dropout_acts_in_training_only_and_post_is_taken_before_it():
    head = make_head(dropout=0.5, hidden=[32])
    x = torch.randn(64, head.n_features)
    torch.manual_seed(1)
    pre, post, a = head.train()(x)
    _, _, b = head(x)
    assert not torch.equal(a, b)  # a new mask each call
    assert torch.equal(post, pre)  # no norm, no activation: post is pre, with no dropout zeros in it
    head.eval()
    torch.testing.assert_close(head(x)[2], head(x)[2], rtol=0, atol=0)
    # eval: the output layer reads post as it is
    torch.testing.assert_close(head(x)[2], head.out(head(x)[1]))


def test_batchnorm_normalises_by_the_batch_in_training_and_by_its_running_statistics_in_eval():
    head = make_head(norm="batchnorm")
    bn = head.norm
    x = torch.randn(32, head.n_features) * 4 + 3
    _, post, _ = head.train()(x)
    torch.testing.assert_close(post.mean(0), torch.zeros(36), atol=1e-5, rtol=0)  # the batch's own mean
    torch.testing.assert_close(bn.running_mean, 0.1 * x.mean(0))  # momentum 0.1 from zero
    assert int(bn.num_batches_tracked) == 1
    head.eval()
    one = x[:1]
    expected = (one - bn.running_mean) / torch.sqrt(bn.running_var + bn.eps) * bn.weight + bn.bias
    torch.testing.assert_close(head(one)[1], expected)  # one row: no batch statistics in eval mode


def test_a_batchnorm_head_ranks_the_same_pairs_the_same_in_any_block(tiny_model_and_tokenizer):
    """Evaluation scores pairs in eval mode (running statistics), so a pair's margin does not depend on the other
    pairs of its block; a head left in training mode would normalise each block by itself."""
    base = tiny_model_and_tokenizer[0]
    torch.manual_seed(0)
    model = BiModel(copy.deepcopy(base.encoder), sim_dim=128, head=spec(norm="batchnorm", hidden=[16]))
    torch.manual_seed(2)
    emb = Embeddings(torch.randn(12, 128), torch.randn(12, 32))
    model.train()
    for _ in range(3):  # running statistics away from their start
        model.head(torch.randn(20, model.head.n_features) * 2 + 1)
    a, b = np.arange(12), np.roll(np.arange(12), 5)
    margins = [pair_margins(model, emb, a, b, batch_size=size) for size in (1, 5, 12)]
    for other in margins[1:]:  # equal but for a BLAS's rounding by block shape; by the batch they differ by ~1
        np.testing.assert_allclose(other, margins[0], rtol=1e-5, atol=1e-6)
    assert model.training  # eval_mode restores the mode it found


def test_a_component_of_the_user_s_own_by_import_path(tmp_path, monkeypatch):
    """model.head.norm=<module>:<factory> with the module outside src/ (written here, put on sys.path): the factory
    is called with the width, its module sits where the norm does, and its parameters train and load like any."""
    (tmp_path / "userheads_m.py").write_text(
        "import torch\n"
        "class ScaleNorm(torch.nn.Module):\n"
        "    def __init__(self, width):\n"
        "        super().__init__()\n"
        "        self.width = width\n"
        "        self.g = torch.nn.Parameter(torch.ones(1))\n"
        "    def forward(self, x):\n"
        "        return self.g * x / x.norm(dim=-1, keepdim=True).clamp(min=1e-5)\n"
        "def not_a_module(width):\n"
        "    return width\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    head = make_head(norm="userheads_m:ScaleNorm", hidden=[16, 8])
    assert [type(m).__name__ for m in (head.hidden[1].norm, head.norm)] == ["ScaleNorm", "ScaleNorm"]
    assert (head.hidden[1].norm.width, head.norm.width) == (16, 8)
    assert "norm.g" in head.state_dict() and "hidden.1.norm.g" in head.state_dict()
    _, post, _ = head(torch.randn(3, 36))
    torch.testing.assert_close(post.norm(dim=-1), torch.ones(3))
    with pytest.raises(ConfigError, match=r"returned a int, not a torch.nn.Module"):
        make_head(norm="userheads_m:not_a_module")


# -- the layout before the head was a component ---------------------------------------------------------------------
def old_layout(state: dict, prefix: str = "") -> dict:
    """A state dict as BiModel wrote it when it was itself the pair head: the head's keys without ``head.``."""
    return {
        k.replace(f"{prefix}head.", prefix, 1) if k.startswith(f"{prefix}head.") else k: v for k, v in state.items()
    }


@pytest.mark.parametrize("flags", [(True, True), (True, False), (False, True), (False, False)])
def test_a_state_dict_of_the_old_layout_loads_into_the_same_head(tiny_model_and_tokenizer, flags):
    base = tiny_model_and_tokenizer[0]
    spec_ = head_spec({"use_layernorm": flags[0], "use_relu": flags[1]})
    torch.manual_seed(5)
    trained = BiModel(copy.deepcopy(base.encoder), head=spec_)
    with torch.no_grad():
        for p in trained.head.parameters():
            p.add_(1.0)
    old = old_layout(trained.state_dict())
    assert any(k.startswith("out.") for k in old) and not any(k.startswith("head.") for k in old)
    assert ("norm.weight" in old) == flags[0]
    torch.manual_seed(6)
    fresh = BiModel(copy.deepcopy(base.encoder), head=spec_)
    fresh.load_state_dict(old)  # strict: every key found, none left over
    assert all(torch.equal(v, trained.state_dict()[k]) for k, v in fresh.state_dict().items())
    assert list(renamed_head_keys(old)) == list(trained.state_dict())  # the same keys, in the same order


def test_the_old_layout_is_renamed_under_a_prefix_and_today_s_keys_are_left_alone():
    old = {"model.encoder.x": 1, "model.sim_head.weight": 2, "model.norm.weight": 3, "model.out.bias": 4}
    assert renamed_head_keys(old, "model.") == {
        "model.encoder.x": 1,
        "model.sim_head.weight": 2,
        "model.head.norm.weight": 3,
        "model.head.out.bias": 4,
    }
    new = {"head.norm.weight": 1, "head.out.weight": 2, "head.hidden.0.norm.weight": 3, "encoder.norm.x": 4}
    assert renamed_head_keys(new) == new
