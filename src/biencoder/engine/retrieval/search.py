"""Nearest-neighbour search by Euclidean distance: exact blocked search or scikit-learn's BallTree (``eval.index`` and
``negatives.index`` choose; the caller passes one, there is no second default here).

``exact`` computes ||q||² + ||x||² − 2 q·x block by block with torch on the given device in float32 (one matmul,
memory at one [block, N] matrix), keeps a shortlist of the nearest ``k + SHORTLIST_EXTRA`` and orders it by the
float64 distance recomputed for those few (equal distances: the lower row first). Where float32 rounding or ties
could leave a row as near as the k-th outside the shortlist, that query is ordered from every row, so the result is
always the float64 order, at float32 speed. BallTree's neighbours are re-sorted the same way, so the two indexes give
the same rows in the same order (tests check a planted neighbour, random data, ties and a collapsed space);
``scripts/bench.py`` shows when each is faster. Where a query needs its distance to every row (a pool of the 8
tasks), :func:`distances` computes them exactly in float64.

:meth:`NeighbourIndex.query_ahead` also counts, in the same pass, the rows ahead of given targets in that float64
order (:func:`ahead`): the float32 pass decides every row it can prove it may, and float64 the few near the target.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import NamedTuple

import numpy as np
import torch
from sklearn.neighbors import BallTree

from ..config.schema import INDEXES
from ..machine.precision import unit_roundoff

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
        self, queries: np.ndarray, k: int, counting: Counting | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """:meth:`query`'s (distances, rows), and with ``counting`` how many rows are :func:`ahead` of each of its
        targets in the float64 order ([Q, R]; None without it), found in the same pass."""
        k = min(k, self.n)
        if not len(queries):  # neither index takes zero queries (BallTree refuses them, the re-rank cannot reshape)
            found = None if counting is None else np.zeros(np.shape(counting.targets), dtype=np.int64)
            return np.zeros((0, k)), np.zeros((0, k), dtype=np.int64), found
        q_all = torch.as_tensor(np.asarray(queries), dtype=torch.float64)
        short = min(self.n, k + SHORTLIST_EXTRA)
        tree = self.tree.query(q_all.numpy(), k=short) if self.kind == "balltree" else None
        dists, rows, aheads = [], [], []
        for start in range(0, len(q_all), self.block):
            q64 = q_all[start : start + self.block].to(self.device, non_blocking=True)
            d2, edge = None, None
            if self.kind == "exact" or counting is not None:
                d2 = torch.addmm(self.norms[None, :], q64.float(), self.data.T, alpha=-2.0)  # ||x||² − 2 q·x
            if self.kind == "exact":
                found = torch.topk(d2, short, dim=1, largest=False, sorted=False)  # [B, short]
                cand, edge = found.indices, found.values.max(1).values  # a row outside is at least `edge` far

                def unsure(d, r, q64=q64, edge=edge):  # float32 rounding may leave a row as near outside
                    return target_bounds(self, q64, r.to(q64.device)).high >= edge

            else:  # the BallTree's neighbours, ordered as exact search orders them
                cand = torch.as_tensor(tree[1][start : start + self.block], device=self.device)
                reach = torch.as_tensor(tree[0][start : start + self.block, -1])

                def unsure(d, r, reach=reach):  # a row outside may tie with the last the BallTree returned
                    return d >= reach * (1 - 1e-9)

            dist, row, whole = self._ordered(torch.sort(cand, dim=1).values, q64, k, unsure)
            if edge is not None:
                edge[whole.to(edge.device)] = torch.inf  # ordered from every row: complete up to any target
            dists.append(dist[:, :k])
            rows.append(row[:, :k])
            if counting is not None:
                prefix = None if edge is None else Prefix(row, edge.cpu())
                aheads.append(ahead(self, q64, d2, counting.of(slice(start, start + self.block)), prefix))
        return (
            torch.cat(dists).double().numpy(),
            torch.cat(rows).numpy(),
            None if counting is None else np.concatenate(aheads),
        )

    def _ordered(
        self,
        cand: torch.Tensor,
        q64: torch.Tensor,
        k: int,
        unsure: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(distances, rows) [B, short] of each query's shortlist ``cand`` (ascending rows) by float64 distance
        (:meth:`_refine`), and whole [B] bool: the queries ordered from every row instead, those where ``unsure``
        (of the k-th row's distance and row, [B] each) says a row outside the shortlist may be as near (ties or
        float32 rounding across its edge), so that the first k are always the float64 order's."""
        by = zip(cand.split(self.refine), q64.split(self.refine), strict=True)
        dist, row = (torch.cat(parts) for parts in zip(*[self._refine(c, q) for c, q in by], strict=True))
        whole = torch.zeros(len(cand), dtype=torch.bool)
        if cand.shape[1] < self.n:
            whole = unsure(dist[:, k - 1], row[:, k - 1]).cpu()
        for i in whole.nonzero(as_tuple=True)[0].tolist():  # rare
            every_d, every_r = self._refine(torch.arange(self.n, device=q64.device)[None], q64[i : i + 1])
            dist[i], row[i] = every_d[0, : cand.shape[1]], every_r[0, : cand.shape[1]]
        return dist, row, whole

    def _refine(self, cand: torch.Tensor, q64: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each query's candidate rows ``cand`` [B, m] (ascending) by float64 distance, nearest first (ties: lower
        row first): (distances [B, m], rows [B, m]) on the CPU. Row by row, so any split of the queries gives the same
        values."""
        rows_of = torch.index_select(self.exact, 0, cand.reshape(-1)).view(*cand.shape, -1)  # [B, short, D]
        exact = squared_distances(rows_of, q64[:, None, :])  # [B, short] float64
        order = torch.sort(exact, dim=1, stable=True)
        return order.values.sqrt().cpu(), cand.gather(1, order.indices).cpu()


def squared_distances(rows: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
    """Float64 squared distances of ``rows`` [..., D] to ``queries`` (broadcast) from the differences: the one formula
    that orders neighbours (:meth:`NeighbourIndex._refine`, :func:`ahead`), so that equal vectors tie exactly."""
    return (rows - queries).pow_(2).sum(-1)


#: the float32 screen's rounding bound in units of the matmul's unit roundoff u (:func:`unit_roundoff`), per unit of
#: D + 4 (D the dimension) and of max ||x||² + 2 |q| max |x|. Rounding the float64 rows and queries, a norm and a dot
#: product (at most D·u of their absolute sums, in any order of summation) and their sum move ||x||² − 2 q·x by less
#: than (D + 4)·u of that scale; the factor 4 is a margin.
SCREEN_ROUNDING = 4
#: (query, row) pairs compared in float64 at once where the screen cannot decide (bounds memory when many tie)
EXACT_CHUNK = 1 << 16
#: the most rows :func:`ahead` compares every one of with a target's bounds; past them a top-k finds the few that
#: matter first (on the 2-core VM the comparisons were faster over ArguAna's 2802 rows, the top-k over 100k:
#: BENCHMARKS.md, item 4)
SCAN_ROWS = 16384


class Prefix(NamedTuple):
    """Each query's first m rows in the order of :meth:`NeighbourIndex.query` (``rows`` [B, m], exact search's), and
    ``edge`` [B]: the largest float32 value of its shortlist; a row outside the shortlist is at least that far, so the
    rows are complete up to any target whose float32 bound stays below the edge."""

    rows: torch.Tensor
    edge: torch.Tensor


class Target(NamedTuple):
    """One target per query: its indexed ``row`` [B] (clamped to 0 where there is none), and the float32 bounds
    ``low``, ``high`` [B] of ||x||² − 2 q·x outside which the screen decides a row (:func:`target_bounds`)."""

    row: torch.Tensor
    low: torch.Tensor
    high: torch.Tensor


def target_bounds(index: NeighbourIndex, q64: torch.Tensor, row: torch.Tensor) -> Target:
    """The :class:`Target` of the indexed rows ``row`` [B] for the queries ``q64`` [B, D]: a row whose float32
    screen value is below ``low`` is surely nearer than the target, above ``high`` surely farther, whatever float32
    rounding (:data:`SCREEN_ROUNDING`, :func:`unit_roundoff`) did to it."""
    u = unit_roundoff(q64.device)
    x_max = index.norms.max()
    scale = x_max + 2 * q64.float().norm(dim=1) * x_max.sqrt()  # [B]: every row's ||x||² + 2 |q| |x| is at most this
    thr = squared_distances(index.exact[row], q64) - (q64 * q64).sum(1)  # the target's ||x||² − 2 q·x in float64
    slack = SCREEN_ROUNDING * (q64.shape[1] + 4) * u * scale + 4 * u * thr.abs().float()
    return Target(row, thr.float() - slack, thr.float() + slack)


class Counting(NamedTuple):
    """What :meth:`NeighbourIndex.query_ahead` counts: the rows ahead of each of ``targets`` [Q, R] (indexed rows, -1:
    none), not counting the rows ``ignore`` [Q, E] names for its query (-1: none), exactly up to ``within`` of them
    (more: :data:`BEYOND`)."""

    targets: np.ndarray
    ignore: np.ndarray
    within: int

    def of(self, block: slice) -> Counting:
        return Counting(self.targets[block], self.ignore[block], self.within)


#: the count of a target with more than ``within`` rows ahead (:class:`Counting`)
BEYOND = -1


def ahead(
    index: NeighbourIndex, q64: torch.Tensor, d2: torch.Tensor, counting: Counting, prefix: Prefix | None = None
) -> np.ndarray:
    """[B, R] how many rows of ``index`` are ahead of each target of ``counting`` in its query's order of
    :meth:`NeighbourIndex.query` (a float64 distance below the target's, or equal to it and a lower row), the ignored
    ones not counted; :data:`BEYOND` where more than ``counting.within`` rows are, and 0 for no target.

    Args: ``q64`` [B, D] float64 queries on the index's device; ``d2`` [B, N] float32 ||x||² − 2 q·x of every row
    (the search's screen); ``prefix``: the search's first rows, when known (exact search): a target among them, below
    their edge, has the rows before it ahead. The other targets are counted by the screen (:func:`target_bounds`),
    and the rows it cannot decide compared in float64 (:func:`squared_distances`).
    """
    targets = torch.as_tensor(np.asarray(counting.targets))
    ignore = torch.as_tensor(np.asarray(counting.ignore), device=q64.device)
    counts = torch.zeros(targets.shape, dtype=torch.long)
    for slot in range(targets.shape[1]):
        row = targets[:, slot]
        target, screened = target_bounds(index, q64, row.clamp(min=0).to(q64.device)), row >= 0
        if prefix is not None:  # a target among the first rows, all of them complete up to it: the rows before it
            place = prefix.rows == row[:, None]
            first = place.any(1) & (target.high.cpu() < prefix.edge)
            counts[first, slot] = (torch.cumsum(place, 1) == 0)[first].sum(1)
            screened &= ~first
        counts[screened, slot] = _count_ahead(index, q64, d2, target, screened.to(q64.device), counting.within).cpu()
        counts[counts[:, slot] > counting.within, slot] = BEYOND
        # the ignored rows that are ahead, by the same comparison
        t = target.row[:, None].expand_as(ignore)
        d64, t64 = _paired_distances(index, q64, ignore.clamp(min=0), t)
        before = ((d64 < t64) | ((d64 == t64) & (ignore < t))) & (ignore >= 0) & (ignore != t)
        counts[:, slot] -= torch.where((row >= 0) & (counts[:, slot] != BEYOND), before.sum(1).cpu(), 0)
    return counts.numpy()


def _paired_distances(
    index: NeighbourIndex, q64: torch.Tensor, rows: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 squared distances of ``rows`` and of ``targets`` (indexed rows, [M] or [B, E]) to their queries
    ``q64`` ([M, D] or [B, D]), in one reduction, so that a row and a target with equal vectors tie exactly (a GPU
    may round a reduction of fewer outputs another way)."""
    query = q64[:, None, :] if rows.dim() == 2 else q64
    both = squared_distances(index.exact[torch.stack([rows, targets])], query[None])
    return both[0], both[1]


def _count_ahead(
    index: NeighbourIndex, q64: torch.Tensor, d2: torch.Tensor, target: Target, which: torch.Tensor, within: int
) -> torch.Tensor:
    """[W] the rows ahead of one ``target`` per query, for the queries ``which`` [B] bool (W of them), or
    :data:`BEYOND` where more than ``within`` are: those the float32 screen ``d2`` puts surely nearer, and those it
    cannot tell from the target (its band) that float64 puts ahead. Over more than :data:`SCAN_ROWS` rows, one
    top-k of ``within`` + 2 per query holds every row that can matter, unless the band reaches past it."""
    picked = which.nonzero(as_tuple=True)[0]
    if not len(picked):
        return torch.zeros(0, dtype=torch.long, device=d2.device)
    screen = d2[picked] if len(picked) < len(d2) else d2
    low, high = target.low[picked, None], target.high[picked, None]
    count = torch.zeros(len(picked), dtype=torch.long, device=d2.device)
    beyond = torch.zeros(len(picked), dtype=torch.bool, device=d2.device)
    p = n = torch.zeros(0, dtype=torch.long, device=d2.device)
    if screen.shape[1] > max(SCAN_ROWS, within + 2):
        top = torch.topk(screen, within + 2, dim=1, largest=False, sorted=False)
        edge = top.values.max(1, keepdim=True).values  # every row outside the top-k is at least this far
        beyond, whole = (edge < low)[:, 0], (edge <= high)[:, 0]  # within + 2 surely ahead; the band past the top-k
        whole &= ~beyond
        count = (top.values < low).sum(1)
        p, col = ((top.values >= low) & (top.values <= high) & ~whole[:, None]).nonzero(as_tuple=True)
        n = top.indices[p, col]
        rows = whole.nonzero(as_tuple=True)[0]
        scanned, lo, hi = screen[rows], low[rows], high[rows]
    else:
        rows, scanned, lo, hi = torch.arange(len(picked), device=d2.device), screen, low, high
    if len(rows):  # every row looked at; the band enumerated where another row shares it with the target
        count[rows] = (scanned < lo).sum(1)
        crowded = ((scanned <= hi).sum(1) - count[rows] != 1).nonzero(as_tuple=True)[0]
        wp, wn = ((scanned[crowded] >= lo[crowded]) & (scanned[crowded] <= hi[crowded])).nonzero(as_tuple=True)
        p, n = torch.cat([p, rows[crowded[wp]]]), torch.cat([n, wn])
    at, t = picked[p], target.row[picked[p]]
    for part in torch.arange(len(p), device=d2.device).split(EXACT_CHUNK):  # the band: compared in float64
        d64, t64 = _paired_distances(index, q64[at[part]], n[part], t[part])
        ahead = ((d64 < t64) | ((d64 == t64) & (n[part] < t[part]))) & (n[part] != t[part])
        count.index_add_(0, p[part], ahead.long())
    return torch.where(beyond | (count > within), BEYOND, count)


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
