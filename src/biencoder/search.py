"""Nearest-neighbour search by Euclidean distance: scikit-learn's BallTree (the default) or exact blocked search.

``exact`` computes ||q||² + ||x||² − 2 q·x block by block with torch on the given device and keeps the top k, so
memory stays at one [block, N] distance matrix. The two agree on every neighbour up to ties and rounding
(tests check a planted neighbour and random data); ``scripts/bench.py`` shows when each is faster.
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.neighbors import BallTree

INDEXES = ("balltree", "exact")


class NeighbourIndex:
    """Index over ``data`` [N, D]; :meth:`query` returns (distances [Q, k], rows [Q, k]) nearest first.

    Args:
        kind: ``balltree`` or ``exact``.
        device: where ``exact`` computes (float64 on the CPU, float32 on a GPU).
        block: queries per distance block for ``exact``.
    """

    def __init__(self, data: np.ndarray, kind: str = "balltree", device: str | torch.device = "cpu", block: int = 2048):
        if kind not in INDEXES:
            raise ValueError(f"index {kind!r} is not one of {INDEXES}")
        self.kind, self.n, self.block = kind, len(data), block
        if kind == "balltree":
            self.tree = BallTree(np.asarray(data, dtype=np.float64))
        else:
            self.device = torch.device(device)
            self.dtype = torch.float64 if self.device.type == "cpu" else torch.float32
            self.data = torch.as_tensor(np.asarray(data), device=self.device, dtype=self.dtype)
            self.norms = (self.data * self.data).sum(1)

    def query(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        k = min(k, self.n)
        if self.kind == "balltree":
            return self.tree.query(np.asarray(queries, dtype=np.float64), k=k)
        dists, rows = [], []
        q_all = torch.as_tensor(np.asarray(queries), dtype=self.dtype)
        for q in q_all.split(self.block):
            q = q.to(self.device, non_blocking=True)
            d2 = (q * q).sum(1, keepdim=True) + self.norms[None, :] - 2.0 * (q @ self.data.T)
            top = torch.topk(d2.clamp_min_(0.0), k, dim=1, largest=False, sorted=True)
            dists.append(top.values.sqrt().cpu())
            rows.append(top.indices.cpu())
        if not dists:
            return np.zeros((0, k)), np.zeros((0, k), dtype=np.int64)
        return torch.cat(dists).double().numpy(), torch.cat(rows).numpy()
