"""Nearest-neighbour search by Euclidean distance: exact blocked search or scikit-learn's BallTree (``eval.index`` and
``negatives.index`` choose; the caller passes one, there is no second default here).

``exact`` computes ||q||² + ||x||² − 2 q·x block by block with torch on the given device in float32 (one matmul,
memory at one [block, N] matrix), keeps a shortlist of the nearest ``k + SHORTLIST_EXTRA`` and orders it by the
float64 distance recomputed for those few: the float32 pass only has to put the true k inside the shortlist, so
the result is the float64 ranking at float32 speed. The two indexes agree on every neighbour up to exact ties
(tests check a planted neighbour and random data); ``scripts/bench.py`` shows when each is faster. Where a query
needs its distance to every row (a pool of the 8 tasks), :func:`distances` computes them exactly in float64.

:meth:`NeighbourIndex.query_ahead` also finds, in the same pass, the rows ahead of given targets in that float64
order (:func:`ahead`): the float32 pass decides every row it can prove it may, and float64 the few near the target.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

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
        self.device, self.rows = torch.device(device), np.asarray(data)
        if index == "balltree":
            self.tree = BallTree(np.asarray(data, dtype=np.float64))

    # the rows as exact search and :func:`ahead`'s screen read them (a BallTree needs them only for :func:`ahead`)
    @cached_property
    def exact(self) -> torch.Tensor:
        """[N, D] float64 on the device: the distances that order neighbours."""
        return torch.as_tensor(self.rows, device=self.device, dtype=torch.float64)

    @cached_property
    def data(self) -> torch.Tensor:
        """[N, D] float32: the screen's rows."""
        return self.exact.float()

    @cached_property
    def norms(self) -> torch.Tensor:
        """[N] float32 ||x||² of :attr:`data`."""
        return (self.data * self.data).sum(1)

    def query(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        dist, rows, _ = self.query_ahead(queries, k)
        return dist, rows

    def query_ahead(
        self, queries: np.ndarray, k: int, targets: np.ndarray | None = None, within: int = 0
    ) -> tuple[np.ndarray, np.ndarray, Ahead | None]:
        """:meth:`query`'s (distances, rows), and with ``targets`` [Q, R] (indexed rows, -1: none) the rows
        :func:`ahead` of each target in the float64 order (None without them), found in the same pass."""
        k = min(k, self.n)
        if not len(queries):  # neither index takes zero queries (BallTree refuses them, the re-rank cannot reshape)
            found = None if targets is None else Ahead.join([], targets.shape[1])
            return np.zeros((0, k)), np.zeros((0, k), dtype=np.int64), found
        q_all = torch.as_tensor(np.asarray(queries), dtype=torch.float64)
        tree = self.tree.query(q_all.numpy(), k=k) if self.kind == "balltree" else None
        dists, rows, aheads = [], [], []
        short = min(self.n, k + SHORTLIST_EXTRA)
        for start in range(0, len(q_all), self.block):
            q64 = q_all[start : start + self.block].to(self.device, non_blocking=True)
            if self.kind == "exact" or targets is not None:
                d2 = torch.addmm(self.norms[None, :], q64.float(), self.data.T, alpha=-2.0)  # ||x||² − 2 q·x
            if targets is not None:
                aheads.append(ahead(self, q64, d2, targets[start : start + self.block], within))
            if self.kind == "exact":
                cand = torch.topk(d2, short, dim=1, largest=False, sorted=False).indices  # [B, short]
                cand = torch.sort(cand, dim=1).values  # equal distances (duplicate texts) keep the lower row first
                for part, q_part in zip(cand.split(self.refine), q64.split(self.refine), strict=True):
                    d, r = self._refine(part, q_part, k)
                    dists.append(d)
                    rows.append(r)
        dist, row = tree if tree is not None else (torch.cat(dists).double().numpy(), torch.cat(rows).numpy())
        return dist, row, None if targets is None else Ahead.join(aheads, targets.shape[1])

    def _refine(self, cand: torch.Tensor, q64: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The k nearest of each query's float32 shortlist ``cand`` [B, short] by float64 distance, nearest first
        (ties: lower row first): (distances [B, k], rows [B, k]) on the CPU. Row by row, so any split of the queries
        gives the same values."""
        rows_of = torch.index_select(self.exact, 0, cand.reshape(-1)).view(*cand.shape, -1)  # [B, short, D]
        exact = squared_distances(rows_of, q64[:, None, :])  # [B, short] float64
        order = torch.sort(exact, dim=1, stable=True)
        return order.values[:, :k].sqrt().cpu(), cand.gather(1, order.indices[:, :k]).cpu()


def squared_distances(rows: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
    """Float64 squared distances of ``rows`` [..., D] to ``queries`` (broadcast) from the differences: the one formula
    that orders neighbours (:meth:`NeighbourIndex._refine`, :func:`ahead`), so that equal vectors tie exactly."""
    return (rows - queries).pow_(2).sum(-1)


@dataclass(frozen=True)
class Ahead:
    """The indexed rows ahead of targets in their queries' float64 order (:func:`ahead`).

    Attributes: ``query``, ``slot``, ``row`` [M]: one entry per (query, the target's column in ``targets``, a row
    ahead of it); ``beyond`` [Q, R] bool: more rows than the ``within`` asked for are ahead of that target (none of
    its rows is listed then).
    """

    query: np.ndarray
    slot: np.ndarray
    row: np.ndarray
    beyond: np.ndarray

    @classmethod
    def join(cls, parts: list[Ahead], slots: int) -> Ahead:
        """The entries of ``parts`` (consecutive blocks of queries, each's ``query`` counted from 0) as one."""
        starts = np.cumsum([0] + [len(p.beyond) for p in parts])[:-1]
        return cls(
            _joined([p.query + start for p, start in zip(parts, starts, strict=True)]),
            _joined([p.slot for p in parts]),
            _joined([p.row for p in parts]),
            np.concatenate([np.zeros((0, slots), dtype=bool)] + [p.beyond for p in parts]),
        )


def _joined(arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([np.zeros(0, dtype=np.int64)] + arrays).astype(np.int64)


#: the float32 screen's rounding bound in units of the matmul's unit roundoff u (:func:`unit_roundoff`), per unit of
#: D + 4 (D the dimension) and of max ||x||² + 2 |q| max |x|. Rounding the float64 rows and queries, a norm and a dot
#: product (at most D·u of their absolute sums, in any order of summation) and their sum move ||x||² − 2 q·x by less
#: than (D + 4)·u of that scale; the factor 4 is a margin.
SCREEN_ROUNDING = 4
#: (query, row) pairs compared in float64 at once where the screen cannot decide (bounds memory when many tie)
EXACT_CHUNK = 1 << 16


def unit_roundoff(device: torch.device) -> float:
    """The unit roundoff of a float32 matrix product on ``device`` as torch is set: 2⁻²⁴ (float32), or that of the
    TF32 (2⁻¹¹) or bfloat16 (2⁻⁸) products ``torch.set_float32_matmul_precision`` or ``allow_tf32`` allow."""
    precision = torch.get_float32_matmul_precision()
    if precision == "medium":
        return 2.0**-8
    tf32 = device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32
    return 2.0**-11 if precision == "high" or tf32 else 2.0**-24


def ahead(index: NeighbourIndex, q64: torch.Tensor, d2: torch.Tensor, targets: np.ndarray, within: int) -> Ahead:
    """The rows of ``index`` ahead of each target in its query's order of :meth:`NeighbourIndex.query` (a float64
    distance below the target's, or equal to it and a lower row; never the target itself).

    Args: ``q64`` [B, D] float64 queries on the index's device; ``d2`` [B, N] float32 ||x||² − 2 q·x of every row
    (the search's screen); ``targets`` [B, R] indexed rows (-1: none); ``within``: a target's rows are listed only when
    at most ``within`` of them are surely ahead, else it is ``beyond``.
    A row whose screen value is farther from the target's float64 value than rounding can move it
    (:data:`SCREEN_ROUNDING`) is decided by the screen; the rest are compared in float64 (:func:`squared_distances`).
    """
    targets, u = np.asarray(targets), unit_roundoff(q64.device)
    x_max = index.norms.max() if index.n else index.norms.new_zeros(())
    scale = x_max + 2 * q64.float().norm(dim=1) * x_max.sqrt()  # [B]: every row's ||x||² + 2 |q| |x| is at most this
    q_sq = (q64 * q64).sum(1)
    queries, slots, rows, beyond = [], [], [], np.zeros(targets.shape, dtype=bool)
    for slot in range(targets.shape[1]):
        target = torch.as_tensor(targets[:, slot], device=q64.device)
        has, target = target >= 0, target.clamp(min=0)
        t64 = squared_distances(index.exact[target], q64)  # [B]
        thr = t64 - q_sq  # the target's ||x||² − 2 q·x in float64
        slack = SCREEN_ROUNDING * (q64.shape[1] + 4) * u * scale + 4 * u * thr.abs().float()
        low, high = (thr.float() - slack)[:, None], (thr.float() + slack)[:, None]
        over = has & ((d2 < low).sum(1) > within)
        beyond[:, slot] = over.cpu().numpy()
        near = (d2 <= high) & (has & ~over)[:, None]  # every row ahead of a listed target
        near[torch.arange(len(target), device=q64.device), target] = False
        b, n = near.nonzero(as_tuple=True)
        keep = d2[b, n] < low[b, 0]
        for part in (~keep).nonzero(as_tuple=True)[0].split(EXACT_CHUNK):  # undecided: compared in float64
            d64, t = squared_distances(index.exact[n[part]], q64[b[part]]), b[part]
            keep[part] = (d64 < t64[t]) | ((d64 == t64[t]) & (n[part] < target[t]))
        queries.append(b[keep].cpu().numpy())
        rows.append(n[keep].cpu().numpy())
        slots.append(np.full(len(rows[-1]), slot))
    return Ahead(_joined(queries), _joined(slots), _joined(rows), beyond)


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
