"""Nearest-neighbour search by Euclidean distance: exact blocked search or scikit-learn's BallTree (``eval.index`` and
``negatives.index`` choose; the caller passes one, there is no second default here).

``exact`` computes ||q||² + ||x||² − 2 q·x block by block with torch on the given device in float32 (one matmul,
memory at one [block, N] matrix), keeps a shortlist of the nearest ``k + SHORTLIST_EXTRA`` and orders it by the
float64 distance recomputed for those few: the float32 pass only has to put the true k inside the shortlist, so
the result is the float64 ranking at float32 speed. The two indexes agree on every neighbour up to exact ties
(tests check a planted neighbour and random data); ``scripts/bench.py`` shows when each is faster. Where a query
needs its distance to every row (a pool of the 8 tasks), :func:`distances` computes them exactly in float64.
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.neighbors import BallTree

from ..config.schema import INDEXES

#: extra float32 neighbours re-ranked in float64: float32 rounding moves a distance by ~1e-6 relative, far less than
#: the gap between the k-th and the (k + 16)-th neighbour
SHORTLIST_EXTRA = 16
#: queries per :meth:`NeighbourIndex.query` call where the caller keeps the neighbours a while (mining, the per-epoch
#: retrieval): they hold [SEARCH_BLOCK, k] at a time, never [Q, k] (k can grow with a text shared by many pairs)
SEARCH_BLOCK = 4096


class NeighbourIndex:
    """Index over ``data`` [N, D]; :meth:`query` returns (distances [Q, k], rows [Q, k]) nearest first.

    Args:
        index: ``exact`` or ``balltree`` (:data:`~biencoder.engine.config.schema.INDEXES`); no default: a run's
            ``eval.index`` or ``negatives.index`` (:class:`~.rerank.Rerank`, :class:`~.negatives.Mining`) names it.
        device: where ``exact`` computes (float32 shortlist, float64 ranking of it).
        block: queries per distance block for ``exact``; default 256 on a CPU, where a [256, N] float32 block of
            distances stays in cache, and 2048 on a GPU (fewer launches); the neighbours do not depend on it.
        refine: queries per float64 re-ranking of the shortlists, default 32 on a CPU (their [32, k + 16, D] float64
            rows stay in cache), the whole block on a GPU; the neighbours do not depend on it.
    """

    def __init__(
        self,
        data: np.ndarray,
        index: str,
        device: str | torch.device = "cpu",
        block: int | None = None,
        refine: int | None = None,
    ):
        if index not in INDEXES:
            raise ValueError(f"index {index!r} is not one of {INDEXES}")
        self.kind, self.n = index, len(data)
        on_cpu = torch.device(device).type == "cpu"
        self.block = block or (256 if on_cpu else 2048)
        self.refine = refine or (32 if on_cpu else self.block)
        if index == "balltree":
            self.tree = BallTree(np.asarray(data, dtype=np.float64))
        else:
            self.device = torch.device(device)
            self.exact = torch.as_tensor(np.asarray(data), device=self.device, dtype=torch.float64)
            self.data = self.exact.float()
            self.norms = (self.data * self.data).sum(1)

    def query(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        k = min(k, self.n)
        if not len(queries):  # neither index takes zero queries (BallTree refuses them, the re-rank cannot reshape)
            return np.zeros((0, k)), np.zeros((0, k), dtype=np.int64)
        if self.kind == "balltree":
            return self.tree.query(np.asarray(queries, dtype=np.float64), k=k)
        dists, rows = [], []
        q_all = torch.as_tensor(np.asarray(queries), dtype=torch.float64)
        short = min(self.n, k + SHORTLIST_EXTRA)
        for q64 in q_all.split(self.block):
            q64 = q64.to(self.device, non_blocking=True)
            q = q64.float()
            d2 = torch.addmm(self.norms[None, :], q, self.data.T, alpha=-2.0)  # ||x||² − 2 q·x (+ ||q||², constant)
            cand = torch.topk(d2, short, dim=1, largest=False, sorted=False).indices  # [B, short]
            cand = torch.sort(cand, dim=1).values  # equal distances (duplicate texts) keep the lower row first
            for part, q_part in zip(cand.split(self.refine), q64.split(self.refine), strict=False):
                d, r = self._refine(part, q_part, k)
                dists.append(d)
                rows.append(r)
        return torch.cat(dists).double().numpy(), torch.cat(rows).numpy()

    def _refine(self, cand: torch.Tensor, q64: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The k nearest of each query's float32 shortlist ``cand`` [B, short] by float64 distance, nearest first
        (ties: lower row first): (distances [B, k], rows [B, k]) on the CPU. Row by row, so any split of the queries
        gives the same values."""
        rows_of = torch.index_select(self.exact, 0, cand.reshape(-1)).view(*cand.shape, -1)  # [B, short, D]
        exact = (rows_of - q64[:, None, :]).pow_(2).sum(-1)  # [B, short] float64
        order = torch.sort(exact, dim=1, stable=True)
        return order.values[:, :k].sqrt().cpu(), cand.gather(1, order.indices[:, :k]).cpu()


def distances(vectors: torch.Tensor, query_rows: np.ndarray, block: int = 256) -> np.ndarray:
    """[P, N] float64 Euclidean distances from the rows ``query_rows`` of ``vectors`` [N, D] to every row, computed
    from the differences (not ||a||² + ||b||² − 2ab), so equal vectors are at exactly equal distances."""
    x = vectors.double()
    q = x[torch.as_tensor(np.asarray(query_rows), dtype=torch.long)]
    return (
        np.concatenate(
            [
                torch.cdist(q[i : i + block], x, compute_mode="donot_use_mm_for_euclid_dist").numpy()
                for i in range(0, len(q), block)
            ]
        )
        if len(q)
        else np.zeros((0, len(x)))
    )
