"""Contiguous parameters (biencoder.engine.training.flat_params): the optimiser over the flat tensors trains what the
optimiser over the parameters trains, bit for bit, and its state is saved and read in the per-parameter form."""

import pytest
import torch
from torch import nn

from biencoder.engine.training.flat_params import ALIGN, FlatParameters, flat_state, per_parameter_state


class Net(nn.Module):
    """Sizes that are multiples of ALIGN and some that are not (385, 7: the CPU kernel's scalar tail), and a layer no
    loss reaches (like BERT's pooler under mean pooling)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(64, 385)
        self.norm = nn.LayerNorm(385)
        self.b = nn.Linear(385, 7)
        self.c = nn.Linear(7, 32)
        self.unused = nn.Linear(32, 32)

    def forward(self, x):
        return self.c(self.b(self.norm(self.a(x)).relu()))

    def groups(self):
        return [
            list(self.a.parameters()) + list(self.unused.parameters()),
            [*self.norm.parameters(), *self.b.parameters(), *self.c.parameters()],
        ]


def optimiser(groups, lrs=(1e-2, 3e-3)):
    return torch.optim.AdamW(
        [{"params": g, "lr": lr} for g, lr in zip(groups, lrs, strict=False)], weight_decay=0.1, fused=True
    )


def train(net, opt, steps, seed, set_to_none):
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        opt.zero_grad(set_to_none=set_to_none)
        net(torch.randn(16, 64, generator=generator)).pow(2).mean().backward()
        opt.step()


def flatten(net):
    return [FlatParameters(g, list(net.unused.parameters())) for g in net.groups()]


def flat_run(steps=5, seed=1):
    net = Net()
    flat = flatten(net)
    opt = optimiser([f.tensors() for f in flat])
    train(net, opt, steps, seed, set_to_none=False)
    return net, flat, opt


def plain_run(steps=5, seed=1):
    net = Net()
    opt = optimiser(net.groups())
    train(net, opt, steps, seed, set_to_none=True)
    return net, opt


def assert_same_state(a: dict, b: dict):
    assert a["param_groups"] == b["param_groups"]
    assert a["state"].keys() == b["state"].keys()
    for index, state in a["state"].items():
        assert state.keys() == b["state"][index].keys()
        for key, value in state.items():
            assert torch.equal(value, b["state"][index][key]), (index, key)


def test_the_layout():
    """Members are the aligned parameters a loss reaches, as views of one tensor (gradients too); the rest are
    loose."""
    net = Net()
    flat = FlatParameters(net.groups()[1], [])
    assert [p.numel() % ALIGN for p in flat.members] == [0] * len(flat.members)
    assert {id(p) for p in flat.loose} == {id(net.norm.weight), id(net.norm.bias), id(net.b.weight), id(net.b.bias)}
    assert flat.tensors()[0] is flat.flat and flat.flat.numel() == 7 * 32 + 32
    flat.flat.data.fill_(2.0)
    assert (net.c.weight == 2.0).all() and (net.c.bias == 2.0).all()
    assert net.c.weight.grad.data_ptr() == flat.flat.grad.data_ptr()
    unused = FlatParameters(list(net.unused.parameters()), list(net.unused.parameters()))
    assert unused.flat is None and unused.tensors() == list(net.unused.parameters())
    net.unused.weight.requires_grad_(False)  # a frozen parameter gets no gradient either: loose
    assert FlatParameters(list(net.unused.parameters())).loose == [net.unused.weight]


def test_flat_training_is_per_parameter_training_bit_for_bit():
    """The same weights and the same optimiser state (in the per-parameter form) after 5 steps; the unused layer is
    untouched by both (no gradient: no weight decay) and has no state."""
    net, flat, opt = flat_run()
    plain, plain_opt = plain_run()
    for (name, p), q in zip(net.named_parameters(), plain.parameters(), strict=True):
        assert torch.equal(p, q), name
    assert torch.equal(net.unused.weight, Net().unused.weight)
    assert_same_state(per_parameter_state(opt.state_dict(), flat), plain_opt.state_dict())


@pytest.mark.parametrize("saved_by", ["flat", "plain"])
def test_a_saved_state_resumes_as_if_never_stopped(saved_by):
    """3 steps, the state saved (per parameter; or by an optimiser before FlatParameters, as an older last.pt) and
    loaded into a new flat optimiser, then 2 more steps: the same as 5 steps in one go."""
    source = flat_run(steps=3) if saved_by == "flat" else plain_run(steps=3)
    state = per_parameter_state(source[2].state_dict(), source[1]) if saved_by == "flat" else source[1].state_dict()
    net = Net()
    net.load_state_dict(source[0].state_dict())
    flat = flatten(net)
    opt = optimiser([f.tensors() for f in flat])
    opt.load_state_dict(flat_state(state, flat))
    train(net, opt, 2, seed=2, set_to_none=False)

    reference, reference_flat, reference_opt = flat_run(steps=3)
    train(reference, reference_opt, 2, seed=2, set_to_none=False)
    for p, q in zip(net.parameters(), reference.parameters(), strict=True):
        assert torch.equal(p, q)
    assert_same_state(
        per_parameter_state(opt.state_dict(), flat), per_parameter_state(reference_opt.state_dict(), reference_flat)
    )


def test_a_state_that_covers_part_of_a_group_is_refused():
    net, opt = plain_run(steps=1)
    state = opt.state_dict()
    del state["state"][8]  # c.weight lost its state; c.bias, the other member of its group, kept its own
    flat = flatten(net)
    with pytest.raises(ValueError, match="only some of the parameters"):
        flat_state(state, flat)


def test_a_state_of_other_parameter_groups_is_refused():
    """A saved optimiser with a group fewer than the model's (another head, another optimiser) is refused in words,
    never matched group by group as far as the shorter goes."""
    net, opt = plain_run(steps=1)
    state = opt.state_dict()
    state["param_groups"] = state["param_groups"][:-1]
    with pytest.raises(ValueError, match=r"the saved optimiser has 1 parameter groups, this model's 2"):
        flat_state(state, flatten(net))


def test_a_flat_optimisers_saved_state_resumes_a_per_parameter_one(tmp_path):
    """The other direction (code from before FlatParameters resuming this version's last.pt): saved through torch.save
    and loaded on the CPU, where loading copies nothing, each parameter has its own step counter, and the per-parameter
    optimiser's 2 more steps are the flat one's, bit for bit (a shared counter would be counted up once per member)."""
    net, flat, opt = flat_run(steps=3)
    torch.save(
        {"model": net.state_dict(), "optimizer": per_parameter_state(opt.state_dict(), flat)}, tmp_path / "s.pt"
    )
    saved = torch.load(tmp_path / "s.pt", map_location="cpu")
    steps = [state["step"] for state in saved["optimizer"]["state"].values()]
    assert len({s.data_ptr() for s in steps}) == len(steps)
    plain = Net()
    plain.load_state_dict(saved["model"])
    plain_opt = optimiser(plain.groups())
    plain_opt.load_state_dict(saved["optimizer"])
    train(plain, plain_opt, 2, seed=2, set_to_none=True)
    train(net, opt, 2, seed=2, set_to_none=False)
    for p, q in zip(net.parameters(), plain.parameters(), strict=True):
        assert torch.equal(p, q)
    assert_same_state(per_parameter_state(opt.state_dict(), flat), plain_opt.state_dict())


def test_members_with_different_step_counts_are_refused():
    net, opt = plain_run(steps=1)
    state = opt.state_dict()
    state["state"][9]["step"] = state["state"][9]["step"] + 1  # c.bias one step ahead of c.weight
    flat = flatten(net)
    with pytest.raises(ValueError, match="'step' differs"):
        flat_state(state, flat)
