"""One optimizer parameter for several tensors: :class:`FlatParameters` (a CPU speed-up of foreach AdamW, used by :mod:`biencoder.engine.epoch`).

On a CPU, ``torch._foreach_*`` dispatches one op per tensor, so foreach AdamW costs about 33 ops per parameter tensor
and step. The frozen-encoder head has 6 small tensors (sim head, LayerNorm, output layer): 199 of a step's ~700 ops.
Viewed into one flat buffer, they are one tensor to the optimizer (46 ops), and since AdamW is elementwise the values
are bit for bit those of the per-tensor update (``tests/test_optim.py`` checks it over many steps).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class FlatParameters:
    """Re-homes ``params`` (same dtype and device) as views into one flat buffer, and their gradients as views into one
    flat gradient buffer; :attr:`flat` is the one parameter to give the optimizer instead of them.

    The model keeps its parameters (same objects, same shapes, same values); only their storage moves, so
    ``state_dict``/``load_state_dict`` of the model work as before. Moving the model (``.to``) afterwards would
    break the views: build this after the model is on its device. Backward accumulates into the existing ``.grad``
    views in place, so :meth:`zero_grad` (not ``set_to_none``) must clear them before each backward.

    :meth:`attach` makes the optimizer's ``state_dict`` hold the per-tensor layout (one entry per original tensor,
    as if the optimizer had been given ``params``), and ``load_state_dict`` accept it: checkpoints do not depend on
    whether the parameters were flattened (a CUDA run, fused and not flattened, resumes a CPU one and back).
    """

    def __init__(self, params: list[nn.Parameter]):
        self.params = list(params)
        if not self.params:
            raise ValueError("FlatParameters needs at least one parameter")
        kinds = {(p.dtype, p.device) for p in self.params}
        if len(kinds) > 1:
            raise ValueError(f"FlatParameters needs one dtype and device, got {sorted(map(str, kinds))}")
        self.shapes = [p.shape for p in self.params]
        self.sizes = [p.numel() for p in self.params]
        with torch.no_grad():
            self.flat = nn.Parameter(torch.cat([p.detach().reshape(-1) for p in self.params]))
        self.grad = torch.zeros_like(self.flat.data)
        self.views = [v.view(s) for v, s in zip(self.flat.data.split(self.sizes), self.shapes)]
        self.grad_views = [v.view(s) for v, s in zip(self.grad.split(self.sizes), self.shapes)]
        for p, data in zip(self.params, self.views):
            p.data = data
        self.zero_grad()

    def zero_grad(self) -> None:
        """Zero the gradients (one op) and (re)attach the views, also after an ``optimizer.zero_grad(set_to_none=True)``
        or a ``model.zero_grad()`` dropped them."""
        self.grad.zero_()
        self.flat.grad = self.grad
        for p, grad in zip(self.params, self.grad_views):
            p.grad = grad

    # -- the optimizer's state in the per-tensor layout ---------------------------------------------------------
    def attach(self, optimizer: torch.optim.Optimizer) -> None:
        """Make ``optimizer`` (which holds :attr:`flat` in one of its groups) save and load its state in the
        per-tensor layout."""
        optimizer.register_state_dict_post_hook(lambda opt, state: self.split_state(opt, state))
        optimizer.register_load_state_dict_pre_hook(lambda opt, state: self.join_state(opt, state))

    def _position(self, optimizer: torch.optim.Optimizer) -> tuple[int, int]:
        """(group index, index of :attr:`flat` in the flat-layout numbering of ``optimizer.state_dict()``)."""
        index = 0
        for g, group in enumerate(optimizer.param_groups):
            for p in group["params"]:
                if p is self.flat:
                    return g, index
                index += 1
        raise ValueError("the optimizer does not hold this FlatParameters' flat parameter")

    def split_state(self, optimizer: torch.optim.Optimizer, state_dict: dict) -> dict:
        """A flat-layout ``state_dict`` → the per-tensor layout (the flat entry becomes ``len(params)`` entries of
        views, the later indices move up)."""
        group, at = self._position(optimizer)
        extra = len(self.params) - 1
        state = {}
        for index, value in state_dict["state"].items():
            if index < at:
                state[index] = value
            elif index > at:
                state[index + extra] = value
            else:
                for i, shape in enumerate(self.shapes):
                    state[at + i] = {key: self._part(v, i, shape) for key, v in value.items()}
        groups = []
        for g, param_group in enumerate(state_dict["param_groups"]):
            ids = [i if i < at else i + extra for i in param_group["params"] if i != at]
            if g == group:
                ids = sorted(ids + list(range(at, at + len(self.params))))
            groups.append({**param_group, "params": ids})
        return {"state": state, "param_groups": groups}

    def _part(self, value, i: int, shape) -> object:
        # the per-element tensors (exp_avg, exp_avg_sq, ...) are cut; the scalar step counter is the same for all.
        # Copies, not views: a per-tensor optimizer loading this must not get one step counter shared by all (foreach
        # AdamW would add 1 to it once per tensor) nor state tensors that overlap in memory
        if isinstance(value, Tensor):
            if value.dim() == 1 and value.numel() == self.flat.numel():
                start = sum(self.sizes[:i])
                value = value[start:start + self.sizes[i]].view(shape)
            return value.clone()
        return value

    def join_state(self, optimizer: torch.optim.Optimizer, state_dict: dict) -> dict:
        """A per-tensor-layout ``state_dict`` (as :meth:`split_state` writes it) → the flat layout ``optimizer``
        loads. Raises ValueError when the group does not hold ``len(params)`` tensors of the right shapes, or when
        their step counters differ."""
        group, at = self._position(optimizer)
        mine = list(range(at, at + len(self.params)))
        if not set(mine) <= set(state_dict["param_groups"][group]["params"]):
            raise ValueError(f"optimizer state: group {group} does not hold the {len(self.params)} flattened "
                             "tensors at the expected positions")
        extra = len(self.params) - 1
        parts = [state_dict["state"].get(i) for i in mine]
        state = {}
        for index, value in state_dict["state"].items():
            if index < at:
                state[index] = value
            elif index >= at + len(self.params):
                state[index - extra] = value
        if any(p is not None for p in parts):
            if any(p is None for p in parts) or any(set(p) != set(parts[0]) for p in parts):
                raise ValueError("optimizer state: some of the flattened tensors have no state or other keys")
            joined = {}
            for key, first in parts[0].items():
                values = [p[key] for p in parts]
                if isinstance(first, Tensor) and first.dim() > 0 and all(
                        isinstance(v, Tensor) and v.shape == s for v, s in zip(values, self.shapes)):
                    joined[key] = torch.cat([v.reshape(-1) for v in values])
                elif all(torch.equal(v, first) if isinstance(first, Tensor) else v == first for v in values):
                    joined[key] = first
                else:
                    raise ValueError(f"optimizer state: '{key}' differs between the flattened tensors")
            state[at] = joined
        groups = []
        for g, param_group in enumerate(state_dict["param_groups"]):
            new = [i if i < at else i - extra for i in param_group["params"] if not at <= i < at + len(self.params)]
            if g == group:
                new = sorted(new + [at])
            groups.append({**param_group, "params": new})
        return {"state": state, "param_groups": groups}
