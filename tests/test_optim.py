"""FlatGroups: foreach AdamW over one flat tensor per group is the per-tensor update bit for bit, and its state_dict is
the per-tensor one (so checkpoints resume across both)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from biencoder.engine.optim import FlatGroups


def head(seed: int = 0) -> nn.Module:
    """A small stand-in of the frozen head's 6 tensors: Linear, LayerNorm, Linear (weights and biases)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(12, 5), nn.LayerNorm(15), nn.Linear(15, 2))


def loss_of(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    sim = model[0](x[:, :12])
    features = torch.cat([sim, x[:, :10]], dim=1)
    return model[2](torch.relu(model[1](features))).square().mean() + sim.abs().mean()


def train(model, optimizer, scheduler, flat, steps, start=0):
    for step in range(start, start + steps):
        x = torch.randn(32, 12, generator=torch.Generator().manual_seed(step))
        optimizer.zero_grad(set_to_none=True)
        if flat is not None:
            flat.zero_grad()
        loss_of(model, x).backward()
        optimizer.step()
        scheduler.step()


def make(flatten, extra_group: bool = False):
    """(model, optimizer, scheduler, flat) as the runner builds them: an optional first group, the head last.
    ``flatten``: False, "last" (only the last group flattened) or "all"."""
    model = head()
    params = list(model.parameters())
    groups = [{"params": params, "lr": 3e-3}]
    if extra_group:  # a first group (the encoder's in the runner): here the first Linear, the head the rest
        groups = [{"params": params[:2], "lr": 1e-3}, {"params": params[2:], "lr": 3e-3}]
    flattened = {False: [], "last": groups[-1:], "all": groups}[flatten]
    flat = FlatGroups([g["params"] for g in flattened]) if flattened else None
    for group, one in zip(flattened, flat.flats if flat else []):
        group["params"] = [one]
    optimizer = torch.optim.AdamW(groups, weight_decay=0.01, foreach=True)
    if flat is not None:
        flat.attach(optimizer)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 - s / 200)
    return model, optimizer, scheduler, flat


def same(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


@pytest.mark.parametrize("extra_group, flatten", [(False, "all"), (True, "last"), (True, "all")])
def test_flat_adamw_equals_per_tensor_bit_for_bit(extra_group, flatten):
    plain, flat = make(False, extra_group), make(flatten, extra_group)
    assert same(plain[0], flat[0])
    train(*plain, steps=60)
    train(*flat, steps=60)
    assert not torch.equal(plain[0][0].weight, head()[0].weight)  # it trained
    assert same(plain[0], flat[0])
    # the gradients the runner's norms read are the per-tensor ones, equal too
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(plain[0].parameters(), flat[0].parameters()))


@pytest.mark.parametrize("extra_group, flatten", [(False, "all"), (True, "last"), (True, "all")])
def test_state_dict_is_the_per_tensor_layout_and_resumes_both_ways(extra_group, flatten):
    plain, flat = make(False, extra_group), make(flatten, extra_group)
    train(*plain, steps=7)
    train(*flat, steps=7)
    saved_plain, saved_flat = plain[1].state_dict(), flat[1].state_dict()
    assert saved_flat["param_groups"] == saved_plain["param_groups"]
    assert saved_flat["state"].keys() == saved_plain["state"].keys() == set(range(6))
    for index, state in saved_plain["state"].items():
        assert state.keys() == saved_flat["state"][index].keys()
        assert all(torch.equal(v, saved_flat["state"][index][k]) for k, v in state.items())
    # each kind resumes from the other's checkpoint and goes on exactly as the uninterrupted run
    for source, target_flat in ((saved_plain, flatten), (saved_flat, False), (saved_flat, flatten)):
        resumed = make(target_flat, extra_group)
        resumed[0].load_state_dict(copy.deepcopy(plain[0].state_dict()))
        resumed[1].load_state_dict(copy.deepcopy(source))
        resumed[2].load_state_dict(plain[2].state_dict())
        train(*resumed, steps=20, start=7)
        reference = make(False, extra_group)
        reference[0].load_state_dict(plain[0].state_dict())
        reference[1].load_state_dict(copy.deepcopy(saved_plain))
        reference[2].load_state_dict(plain[2].state_dict())
        train(*reference, steps=20, start=7)
        assert same(resumed[0], reference[0]), (source is saved_plain, target_flat)


def test_a_state_of_other_shapes_is_refused():
    plain, flat = make(False), make("all")
    train(*plain, steps=2)
    saved = plain[1].state_dict()
    saved["state"][3]["step"] = saved["state"][3]["step"] + 1  # one tensor a step ahead of the others
    with pytest.raises(ValueError, match="'step' differs"):
        flat[1].load_state_dict(saved)


def test_views_survive_a_model_zero_grad_and_load_state_dict():
    model, optimizer, scheduler, flat = make("all")
    model.zero_grad(set_to_none=True)  # drops the views; zero_grad re-attaches them
    train(model, optimizer, scheduler, flat, steps=1)
    assert all(p.grad.untyped_storage().data_ptr() == flat.grads[0].untyped_storage().data_ptr()
               for p in model.parameters())
    model.load_state_dict(head(seed=1).state_dict())  # copies into the views: the flat tensor sees the new values
    assert torch.equal(flat.flats[0].data, torch.cat([p.reshape(-1) for p in head(seed=1).parameters()]))


def test_an_unused_pooler_is_left_out_of_the_optimiser_and_never_changes(tmp_path):
    """With mean pooling the encoder's pooler feeds nothing: it is not optimised, so weight decay on a flat tensor
    (which gives every view a zero gradient, not None) cannot shrink it; the other parameters train."""
    from biencoder.engine.runner import Runner
    from conftest import compose_cfg

    runner = Runner(compose_cfg(["model=tiny", "model.pooling=mean", "trainer.max_epochs=1", "trainer.progress=false",
                                 "trainer.weight_decay=0.5", "eval.baselines=false"]), tmp_path)
    pooler = {k: v.detach().clone() for k, v in runner.model.encoder.pooler.state_dict().items()}
    layer = runner.model.encoder.encoder.layer[0].output.dense.weight.detach().clone()
    assert runner.trainer.flat is not None  # the CPU path: the groups are flat
    held = {id(p) for params in runner.trainer.flat.groups for p in params}
    assert not any(id(p) in held for p in runner.model.encoder.pooler.parameters())
    runner.trainer.train_epoch(0, runner.trainer.mine(0, runner.embed("train").sim))
    assert all(torch.equal(v, runner.model.encoder.pooler.state_dict()[k]) for k, v in pooler.items())
    assert not torch.equal(layer, runner.model.encoder.encoder.layer[0].output.dense.weight)
