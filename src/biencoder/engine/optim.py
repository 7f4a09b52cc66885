"""One optimizer parameter per group: :class:`FlatGroups` (a CPU speed-up of foreach AdamW, used by
:mod:`biencoder.engine.epoch`).

On a CPU, ``torch._foreach_*`` dispatches one op per tensor, so foreach AdamW costs about 33 ops per parameter tensor
and step: 199 of the frozen head's ~700 ops per step (6 tensors), 3343 of the MiniLM-sized step's ~7400 (about 100).
Viewed into one flat buffer per group, each group is one tensor to the optimizer, and since AdamW is elementwise the
values are bit for bit those of the per-tensor update (``tests/test_optim.py`` checks it over many steps).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class FlatGroups:
    """Re-homes the tensors of each of ``groups`` (lists of parameters of one dtype and device) as views into one flat
    buffer, and their gradients as views into one flat gradient buffer; :attr:`flats` [i] is the one parameter to give
    the optimizer instead of ``groups[i]``.

    The model keeps its parameters (same objects, shapes and values); only their storage moves, so the model's
    ``state_dict``/``load_state_dict`` work as before. Moving the model (``.to``) afterwards would break the views:
    build this after the model is on its device. Backward adds into the existing ``.grad`` views in place, so
    :meth:`zero_grad` (not ``set_to_none``) must clear them before each backward.

    :meth:`attach` makes the optimizer's ``state_dict`` hold the per-tensor layout (as if it had been given the
    groups' tensors), and ``load_state_dict`` accept it: checkpoints do not depend on whether the parameters were
    flattened (a CUDA run, fused and not flattened, resumes a CPU one and back).
    """

    def __init__(self, groups: list[list[nn.Parameter]]):
        self.groups = [list(params) for params in groups]
        if not all(self.groups):
            raise ValueError("FlatGroups needs at least one parameter per group")
        self.flats, self.grads = [], []
        for params in self.groups:
            kinds = {(p.dtype, p.device) for p in params}
            if len(kinds) > 1:
                raise ValueError(f"FlatGroups needs one dtype and device per group, got {sorted(map(str, kinds))}")
            with torch.no_grad():
                flat = nn.Parameter(torch.cat([p.detach().reshape(-1) for p in params]))
            for p, data in zip(params, self._views(flat.data, params)):
                p.data = data
            self.flats.append(flat)
            self.grads.append(torch.zeros_like(flat.data))
        self.zero_grad()

    @staticmethod
    def _views(flat: Tensor, params: list[Tensor]) -> list[Tensor]:
        return [v.view(p.shape) for v, p in zip(flat.split([p.numel() for p in params]), params)]

    def zero_grad(self) -> None:
        """Zero the gradients (one op per group) and (re)attach the views, also after an
        ``optimizer.zero_grad(set_to_none=True)`` or a ``model.zero_grad()`` dropped them."""
        for flat, grad, params in zip(self.flats, self.grads, self.groups):
            grad.zero_()
            flat.grad = grad
            for p, view in zip(params, self._views(grad, params)):
                p.grad = view

    # -- the optimizer's state in the per-tensor layout ---------------------------------------------------------
    def attach(self, optimizer: torch.optim.Optimizer) -> None:
        """Make ``optimizer`` (which holds the :attr:`flats`) save and load its state in the per-tensor layout."""
        optimizer.register_state_dict_post_hook(lambda opt, state: self.split_state(opt, state))
        optimizer.register_load_state_dict_pre_hook(lambda opt, state: self.join_state(opt, state))

    def _layout(self, optimizer: torch.optim.Optimizer) -> list[list[list[Tensor] | None]]:
        """Per optimizer group, per parameter: the tensors a flat stands for, or None for an ordinary parameter."""
        of = {id(flat): params for flat, params in zip(self.flats, self.groups)}
        return [[of.get(id(p)) for p in group["params"]] for group in optimizer.param_groups]

    def split_state(self, optimizer: torch.optim.Optimizer, state_dict: dict) -> dict:
        """A flat-layout ``state_dict`` → the per-tensor layout (a flat's entry becomes one entry per tensor)."""
        state, groups, old, new = {}, [], 0, 0
        for saved, layout in zip(state_dict["param_groups"], self._layout(optimizer)):
            ids = []
            for params in layout:
                value = state_dict["state"].get(old)
                if params is None:
                    if value is not None:
                        state[new] = value
                    ids.append(new)
                    new += 1
                else:
                    for i, p in enumerate(params):
                        if value is not None:
                            state[new] = {key: self._part(v, params, i) for key, v in value.items()}
                        ids.append(new)
                        new += 1
                old += 1
            groups.append({**saved, "params": ids})
        return {"state": state, "param_groups": groups}

    @staticmethod
    def _part(value, params: list[Tensor], i: int) -> object:
        # the per-element tensors (exp_avg, exp_avg_sq, ...) are cut; the scalar step counter is the same for all.
        # Copies, not views: a per-tensor optimizer loading this must not get one step counter shared by all (foreach
        # AdamW would add 1 to it once per tensor) nor state tensors that overlap in memory
        if isinstance(value, Tensor):
            if value.dim() == 1 and value.numel() == sum(p.numel() for p in params):
                start = sum(p.numel() for p in params[:i])
                value = value[start:start + params[i].numel()].view(params[i].shape)
            return value.clone()
        return value

    def join_state(self, optimizer: torch.optim.Optimizer, state_dict: dict) -> dict:
        """A per-tensor-layout ``state_dict`` (as :meth:`split_state` writes it) → the flat layout ``optimizer``
        loads. Raises ValueError when a group does not hold the tensors of the right number and shapes, or when
        their step counters differ."""
        state, groups, new = {}, [], 0
        for g, (saved, layout) in enumerate(zip(state_dict["param_groups"], self._layout(optimizer))):
            ids, at = [], iter(saved["params"])
            mine = sum(1 if params is None else len(params) for params in layout)
            if len(saved["params"]) != mine:
                raise ValueError(f"optimizer state: group {g} holds {len(saved['params'])} tensors, this run's {mine} (a "
                                 "checkpoint of another model or biencoder version): resume it with the version that "
                                 "wrote it, or start a new run folder")
            for params in layout:
                if params is None:
                    index = next(at)
                    if index in state_dict["state"]:
                        state[new] = state_dict["state"][index]
                else:
                    joined = self._join([state_dict["state"].get(next(at)) for _ in params], params)
                    if joined is not None:
                        state[new] = joined
                ids.append(new)
                new += 1
            groups.append({**saved, "params": ids})
        return {"state": state, "param_groups": groups}

    @staticmethod
    def _join(parts: list[dict | None], params: list[Tensor]) -> dict | None:
        """One flat tensor's state from its tensors' states (None when none has state yet)."""
        if all(p is None for p in parts):
            return None
        if any(p is None for p in parts) or any(set(p) != set(parts[0]) for p in parts):
            raise ValueError("optimizer state: some of the flattened tensors have no state or other keys")
        joined = {}
        for key, first in parts[0].items():
            values = [p[key] for p in parts]
            if isinstance(first, Tensor) and first.dim() > 0 and all(
                    isinstance(v, Tensor) and v.shape == p.shape for v, p in zip(values, params)):
                joined[key] = torch.cat([v.reshape(-1) for v in values])
            elif all(torch.equal(v, first) if isinstance(first, Tensor) else v == first for v in values):
                joined[key] = first
            else:
                raise ValueError(f"optimizer state: '{key}' differs between the flattened tensors")
        return joined
