"""Contiguous parameters: the optimiser steps one tensor per parameter group instead of one per parameter.

:class:`FlatParameters` makes a group's parameters views of one buffer and their gradients views of a second;
backward adds into those views in place, and AdamW's fused kernel runs over the one flat tensor. On a CPU that kernel
loops over the tensors of its list, about 7 ops each (each reads its step counter): 753 of the 4244 ops of a
MiniLM-sized training step (``scripts/bench.py --items steps``). FSDP's ``FlatParameter`` and DeepSpeed's contiguous
gradients are the same idea.

Two kinds of parameter stay as they are (*loose*), so that training computes what it computed per parameter, to
the last bit:

* a size that is not a multiple of :data:`ALIGN`: the CPU kernel runs each tensor's last ``size % vector width``
  values through scalar code, which rounds differently from its vector code;
* a parameter no loss reaches (``unused``: BERT's pooler under cls or mean pooling), or one that does not require a
  gradient: without a gradient, AdamW leaves it alone, while a flat member would get a zero gradient and its weight
  decay.

The optimiser's state is saved in the per-parameter form (:func:`per_parameter_state`) and read back from it
(:func:`flat_state`): a ``last.pt`` does not depend on the layout, and one from before it resumes.
"""

from __future__ import annotations

import torch
from torch import nn

#: members' sizes are multiples of this many values: 16 float32 = 64 bytes, the CPU kernel's task unit and its
#: widest vector (AVX-512), so each member starts and ends where the kernel's vector code does
ALIGN = 16


class FlatParameters:
    """One optimiser group's ``params``, the members (see the module) moved into one flat parameter.

    The members' ``.data`` become views of :attr:`flat` and their ``.grad`` views of ``flat.grad`` (zeros until the
    first backward), in the order given. Anything that replaces a member's storage afterwards (``model.to(...)``)
    cuts it off from the optimiser: move the model first. Clear the gradients with ``zero_grad(set_to_none=False)``.
    """

    def __init__(self, params: list[nn.Parameter], unused: list[nn.Parameter] = ()):
        self.params = list(params)
        skip = {id(p) for p in unused}
        first = next((p for p in self.params if id(p) not in skip and p.requires_grad), None)
        self.members = [
            p
            for p in self.params
            if id(p) not in skip
            and p.requires_grad
            and p.numel() % ALIGN == 0
            and (p.device, p.dtype) == (first.device, first.dtype)
        ]
        member_ids = {id(p) for p in self.members}
        self.loose = [p for p in self.params if id(p) not in member_ids]
        self.flat = None
        if self.members:
            size = sum(p.numel() for p in self.members)
            data = torch.empty(size, dtype=first.dtype, device=first.device)
            grad = torch.zeros_like(data)
            for p, p_data, p_grad in zip(self.members, self.views(data), self.views(grad), strict=True):
                p_data.copy_(p.detach())
                p.data, p.grad = p_data, p_grad
            self.flat = nn.Parameter(data)
            self.flat.grad = grad

    def tensors(self) -> list[nn.Parameter]:
        """What the optimiser steps: the flat parameter (if any members), then the loose ones in their order."""
        return ([self.flat] if self.flat is not None else []) + self.loose

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """A tensor laid out as :attr:`flat` (an optimiser state such as ``exp_avg``) → one view per member."""
        out, start = [], 0
        for p in self.members:
            out.append(flat[start : start + p.numel()].view_as(p))
            start += p.numel()
        return out


def per_parameter_state(state: dict, groups: list[FlatParameters]) -> dict:
    """``optimizer.state_dict()`` of an optimiser over ``[g.tensors() for g in groups]`` → the state dict of one over
    the groups' own parameters, in their order (what ``torch.optim`` writes without :class:`FlatParameters`). A
    member's state is a view of the flat state, but for ``step``, a scalar, copied per member."""
    out, groups_out, index = {}, [], 0
    for group, saved in zip(groups, state["param_groups"], strict=True):
        ids = dict(zip(map(id, group.tensors()), saved["params"], strict=True))
        flat = state["state"].get(ids[id(group.flat)]) if group.flat is not None else None
        # a scalar state (``step``) is cloned per member: a shared one would be counted up once per member by a
        # per-parameter optimiser that loads this on the CPU (where loading copies nothing)
        views = (
            {
                key: group.views(value) if _is_flat(value, group) else [value.clone() for _ in group.members]
                for key, value in flat.items()
            }
            if flat
            else {}
        )
        members = {id(p): n for n, p in enumerate(group.members)}
        params = []
        for p in group.params:
            if id(p) in members and flat:
                out[index] = {key: values[members[id(p)]] for key, values in views.items()}
            elif id(p) not in members and ids[id(p)] in state["state"]:
                out[index] = state["state"][ids[id(p)]]
            params.append(index)
            index += 1
        groups_out.append({**saved, "params": params})
    return {"state": out, "param_groups": groups_out}


def flat_state(state: dict, groups: list[FlatParameters]) -> dict:
    """The inverse of :func:`per_parameter_state`: a per-parameter state dict (this version's ``last.pt``, or one
    written before :class:`FlatParameters`) → the state dict of the optimiser over ``[g.tensors() for g in groups]``.
    Raises ValueError when some members have a state and others not (no run of this code writes that)."""
    out, groups_out, index = {}, [], 0
    if len(state["param_groups"]) != len(groups):
        raise ValueError(
            f"the saved optimiser has {len(state['param_groups'])} parameter groups, this model's {len(groups)}"
        )
    for group, saved in zip(groups, state["param_groups"], strict=True):
        if len(saved["params"]) != len(group.params):
            raise ValueError(
                f"the saved optimiser group has {len(saved['params'])} parameters, this model's {len(group.params)}"
            )
        of = dict(zip(map(id, group.params), saved["params"], strict=True))
        members = [state["state"].get(of[id(p)]) for p in group.members]
        params = []
        if group.flat is not None:
            if any(m is None for m in members) and not all(m is None for m in members):
                raise ValueError("the saved optimiser state covers only some of the parameters of a group")
            if members[0] is not None:
                out[index] = {
                    key: torch.cat([m[key].reshape(-1) for m in members])
                    if _is_flat(value, group, whole=False)
                    else _common(key, [m[key] for m in members])
                    for key, value in members[0].items()
                }
            params.append(index)
            index += 1
        for p in group.loose:
            if of[id(p)] in state["state"]:
                out[index] = state["state"][of[id(p)]]
            params.append(index)
            index += 1
        groups_out.append({**saved, "params": params})
    return {"state": out, "param_groups": groups_out}


def _common(key: str, values: list[torch.Tensor]) -> torch.Tensor:
    """A copy of the scalar state (``step``) every member of a group has; ValueError when they differ."""
    if any(not torch.equal(v, values[0]) for v in values[1:]):
        raise ValueError(f"the saved optimiser state's {key!r} differs between parameters of one group")
    return values[0].clone()


def _is_flat(value, group: FlatParameters, whole: bool = True) -> bool:
    """Whether an optimiser state ``value`` is laid out like its parameter (``exp_avg``; not the scalar ``step``):
    like the flat parameter (``whole``) or like the group's first member."""
    like = group.flat if whole else group.members[0]
    return isinstance(value, torch.Tensor) and value.shape == like.shape and value.dim() > 0
