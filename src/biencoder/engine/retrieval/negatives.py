"""Hard-negative mining over sim embeddings by exact search (or scikit-learn's BallTree), mixed with random negatives.

For every pair's point: the nearest argument of the split, point or counter (by Euclidean distance of the sim
embeddings, one search over all of them: ``negatives.index``), skipping the point itself, its own counter and every
argument whose text equals the point's or the counter's text, is the hard negative. (This is the closer of the
nearest allowed point and the nearest allowed counter; at equal distance the lower row, a point, wins.)
With probability ``random_rate`` a uniformly random eligible argument is taken instead; only the points of the pairs
without a random negative are searched for.

Two selection rules change which eligible argument a hard pair gets (:class:`Mining`; both off by default, so the
nearest one, as ever):

* ``negatives.relative_margin`` m: a candidate is skipped when its distance to the point is below (1 + m) times the
  counter's. It is sentence-transformers' ``mine_hard_negatives(relative_margin=m)``, which skips a candidate whose
  similarity exceeds ``positive_score - abs(positive_score) * m``, with the similarity read as minus the Euclidean
  distance of the sim vectors (the distance this space retrieves by): −d > −d⁺ − d⁺·m is d < (1 + m)·d⁺. A pair for
  which no argument passes takes the farthest eligible one (the one nearest to passing).
* ``negatives.rank_range`` [lo, hi]: the negative is drawn uniformly among the candidates ranked lo..hi (1 = the
  nearest; the point itself, its counter and their texts' twins take no rank; with a margin, only the candidates
  that pass it count), as FlagEmbedding's ``hn_mine --range_for_sampling lo-hi`` samples among the ranks lo..hi of
  its search (it counts from 0 over the whole corpus and drops the positives and the query after slicing). A pair
  with fewer than lo candidates takes its last one. The draws come from the mining RNG after the random negatives'
  draws, so a seed's random negatives are the same under every rule.

Under a rule every eligible argument is ranked by its exact float64 distance (:func:`_ranked_allowed`), so
``negatives.n_neighbors`` and ``negatives.index`` play no part there.

:func:`negatives_record` is what ``negatives.log=true`` writes per epoch, :func:`summarise_record` one epoch's
summary of it (``biencoder-corpus negatives``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..config.schema import NegativesSchema, RandomRateSchema
from ..data.corpus import PairedSplit
from ..machine.runtime import Runtime
from .search import SEARCH_BLOCK, NeighbourIndex


def random_rate(epoch: int, start: float = RandomRateSchema.start, decay: float = RandomRateSchema.decay) -> float:
    """Share of random negatives in ``epoch``: ``max(0, start − decay·epoch)``."""
    return max(0.0, start - decay * epoch)


@dataclass(frozen=True)
class Mining:
    """How hard negatives are searched for: ``n_neighbors`` neighbours fetched at first (more for the rare rows that
    need them), by the ``index`` ``exact`` or ``balltree`` (:mod:`biencoder.engine.retrieval.search`; ``device`` is
    where ``exact`` runs). The defaults are the schema's (``negatives.n_neighbors``, ``negatives.index``)."""

    n_neighbors: int = NegativesSchema.n_neighbors
    index: str = NegativesSchema.index
    device: str | torch.device = "cpu"
    relative_margin: float | None = NegativesSchema.relative_margin
    rank_range: tuple[int, int] | None = NegativesSchema.rank_range

    @classmethod
    def of_run(cls, negatives: NegativesSchema, runtime: Runtime) -> Mining:
        """A run's: ``negatives.n_neighbors``, ``negatives.index``, ``negatives.relative_margin`` and
        ``negatives.rank_range``, on the runtime's device."""
        margin, ranks = negatives.relative_margin, negatives.rank_range
        return cls(
            negatives.n_neighbors,
            negatives.index,
            runtime.device,
            relative_margin=None if margin is None else float(margin),
            rank_range=None if ranks is None else (int(ranks[0]), int(ranks[1])),
        )

    @property
    def hardest(self) -> bool:
        """The nearest eligible argument, as ever: neither selection rule is on."""
        return self.relative_margin is None and self.rank_range is None


@dataclass
class MinedNegatives:
    """One negative per pair: ``row`` [Q] in the split's table, ``is_random`` [Q], ``distance`` [Q] (sim space)."""

    row: np.ndarray
    is_random: np.ndarray
    distance: np.ndarray
    rate: float

    def stats(self) -> dict[str, float]:
        return {
            "random_rate": self.rate,
            "share_random": float(self.is_random.mean()),
            "share_hard": float(1.0 - self.is_random.mean()),
            "neg_distance": float(self.distance.mean()),
            "neg_distance_hard": float(self.distance[~self.is_random].mean())
            if (~self.is_random).any()
            else float("nan"),
        }


def forbidden_texts(split: PairedSplit) -> np.ndarray:
    """[Q, 2] text ids a pair's negative must not have: the point's and its counter's."""
    return np.stack([split.text_id[split.query], split.text_id[split.counter]], axis=1)


def has_eligible(text_id: np.ndarray, banned: np.ndarray) -> np.ndarray:
    """[Q] bool: some argument's text is neither of the pair's two ``banned`` [Q, 2] text ids. Only a split of at most
    two distinct texts can have a pair without one."""
    unique = np.unique(text_id)
    if len(unique) > 2:
        return np.ones(len(banned), bool)
    return (unique[None, :, None] != banned[:, None, :]).all(axis=2).any(axis=1)


def _first_allowed(
    tree: NeighbourIndex, sim: np.ndarray, queries: np.ndarray, banned: np.ndarray, text_id: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Nearest row of the split's table (indexed by ``tree``) per query whose text id is not banned; -1 / inf if none.

    A block of :data:`~biencoder.engine.retrieval.search.SEARCH_BLOCK` queries at a time: a query's neighbours are its
    own (the search is row by row) and so is how far its k doubles, so the blocks change no row, and a text shared by
    many pairs (whose queries need k ~ their count) costs [block, k], never [Q, k]."""
    best = np.full(len(queries), -1)
    dist = np.full(len(queries), np.inf)
    for start in range(0, len(queries), SEARCH_BLOCK):
        block = slice(start, start + SEARCH_BLOCK)
        best[block], dist[block] = _first_allowed_block(tree, sim, queries[block], banned[block], text_id, k)
    return best, dist


def _first_allowed_block(
    tree: NeighbourIndex, sim: np.ndarray, queries: np.ndarray, banned: np.ndarray, text_id: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_first_allowed` of one block of queries: k neighbours, then 2k for the queries that found none, ..."""
    best = np.full(len(queries), -1)
    dist = np.full(len(queries), np.inf)
    todo = np.arange(len(queries))
    while len(todo):
        k = min(k, tree.n)
        d, i = tree.query(sim[queries[todo]], k)
        cand = i  # [T, k] rows of the split table, nearest first
        ok = np.all(text_id[cand][:, :, None] != banned[todo][:, None, :], axis=2)
        found = ok.any(axis=1)
        first = ok.argmax(axis=1)
        best[todo[found]] = cand[found, first[found]]
        dist[todo[found]] = d[found, first[found]]
        if k == tree.n:
            break
        todo, k = todo[~found], 2 * k
    return best, dist


def _row_block(n_rows: int) -> int:
    """Queries per block of a full [block, n_rows] float64 distance pass: at most
    :data:`~biencoder.engine.retrieval.search.SEARCH_BLOCK`, and about 4 M distances (32 MB) a block."""
    return max(1, min(SEARCH_BLOCK, (1 << 22) // max(n_rows, 1)))


def _squared_distances(points: np.ndarray, sim: np.ndarray, squares: np.ndarray) -> np.ndarray:
    """[B, N] float64 squared Euclidean distances of ``points`` [B, D] to every row of ``sim`` [N, D] (``squares``: the
    rows' squared norms), never below 0."""
    return np.maximum((points * points).sum(axis=1)[:, None] + squares[None, :] - 2.0 * points @ sim.T, 0.0)


def _allowed(text_id: np.ndarray, banned: np.ndarray) -> np.ndarray:
    """[B, N] bool: row n's text ``text_id[n]`` is none of query b's ``banned[b]`` text ids (any number of them)."""
    allowed = np.ones((len(banned), len(text_id)), dtype=bool)
    for column in banned.T:
        allowed &= text_id[None, :] != column[:, None]
    return allowed


def _nearest(key: np.ndarray, need: int) -> np.ndarray:
    """[B, need] columns of the ``need`` smallest of each row of ``key``, smallest first, equal values lower column
    first (which of equal values at the ``need``-th place gets in is argpartition's choice)."""
    if need == 1:
        return key.argmin(axis=1)[:, None]  # the first of equal values
    if need < key.shape[1]:
        part = np.argpartition(key, need - 1, axis=1)[:, :need]
    else:
        part = np.broadcast_to(np.arange(key.shape[1]), key.shape)
    values = np.take_along_axis(key, part, axis=1)
    order = np.lexsort((part, values), axis=1)
    return np.take_along_axis(part, order, axis=1)


def _ranked_allowed(
    sim: np.ndarray, points: np.ndarray, banned: np.ndarray, text_id: np.ndarray, floor: np.ndarray, need: int
) -> tuple[np.ndarray, np.ndarray]:
    """The first ``need`` candidates of each query vector of ``points`` [T, D], nearest first (equal distances: the
    lower row first): rows of ``sim`` whose text is not banned and whose distance is at least the query's ``floor``
    [T]. Returns (rows [T, need], -1 past the last found; the farthest allowed row [T] for the queries that found
    none, else -1).

    One exact float64 pass over every row per block of queries (:func:`_row_block`), not a k-nearest search: a margin
    can skip many candidates (with a random head, the counter is often far down the ranking), which would make a
    search's k double up to the whole table, each time from the start."""
    squares = (sim * sim).sum(axis=1)
    need = min(need, len(sim))
    rows = np.full((len(points), need), -1)
    farthest = np.full(len(points), -1)
    size = _row_block(len(sim))
    for start in range(0, len(points), size):
        part = slice(start, start + size)
        distance = np.sqrt(_squared_distances(points[part], sim, squares))
        allowed = _allowed(text_id, banned[part])
        key = np.where(allowed & (distance >= floor[part, None]), distance, np.inf)
        first = _nearest(key, need)
        found = np.isfinite(np.take_along_axis(key, first, axis=1))
        rows[part] = np.where(found, first, -1)
        farthest[part] = np.where(found[:, 0], -1, np.where(allowed, distance, -np.inf).argmax(axis=1))
    return rows, farthest


def _pick(rows: np.ndarray, farthest: np.ndarray, rank_range: tuple[int, int] | None, rng) -> np.ndarray:
    """One row per query from its candidates ``rows`` [T, need] (-1 past the last): the first without a
    ``rank_range``, else a uniform draw among the ranks lo..min(hi, found) (the last found when fewer than lo);
    ``farthest`` where none was found."""
    found = (rows >= 0).sum(axis=1)
    if rank_range is None:
        position = np.zeros(len(rows), dtype=np.int64)
    else:
        lo, hi = rank_range
        top = np.minimum(hi, found)
        low = np.minimum(lo, np.maximum(top, 1))
        position = rng.integers(low, np.maximum(top, low), endpoint=True) - 1
    picked = rows[np.arange(len(rows)), np.minimum(position, rows.shape[1] - 1)]
    return np.where(found > 0, picked, farthest)


def mine_negatives(
    sim: np.ndarray, split: PairedSplit, rate: float, rng: np.random.Generator, mining: Mining = Mining()
) -> MinedNegatives:
    """One negative per pair of ``split``.

    Args:
        sim: [2Q, D] sim embeddings of the split's table rows (points then counters, see ``PairedSplit``).
        rate: probability of a random instead of a hard negative.
        rng: the only source of randomness (seeded by the caller).
        mining: how the hard ones are searched for (:class:`Mining`).
    Returns:
        :class:`MinedNegatives`; a negative never has the text of the point or of its counter.
    """
    sim = np.asarray(sim, dtype=np.float64)
    text_id = split.text_id
    banned = forbidden_texts(split)
    queries = split.query
    if not has_eligible(text_id, banned).all():
        raise ValueError("a pair has no eligible negative: the split needs at least one argument with another text")
    # the draw first, then the search for the hard ones only: a pair that gets a random negative needs no neighbours
    # (most of them early on: rate 0.8 at epoch 0). The search is row by row, so the hard rows are what a search of
    # every pair gives them; the RNG is drawn in the same order as ever
    is_random = rng.random(len(queries)) < rate
    row = np.full(len(queries), -1)
    hard = np.flatnonzero(~is_random)
    ranked = None
    if len(hard):
        if mining.hardest:
            tree = NeighbourIndex(sim, mining.index, mining.device)
            row[hard], _ = _first_allowed(tree, sim, queries[hard], banned[hard], text_id, mining.n_neighbors)
        else:
            positive = np.linalg.norm(sim[queries[hard]] - sim[split.counter[hard]], axis=1)
            floor = (1.0 + mining.relative_margin) * positive if mining.relative_margin is not None else positive * 0
            need = mining.rank_range[1] if mining.rank_range is not None else 1
            ranked = _ranked_allowed(sim, sim[queries[hard]], banned[hard], text_id, floor, need)
    todo = np.flatnonzero(is_random)
    while len(todo):  # rejection sampling: eligible arguments are the vast majority
        draw = rng.integers(0, len(text_id), size=len(todo))
        ok = np.all(text_id[draw][:, None] != banned[todo], axis=1)
        row[todo[ok]] = draw[ok]
        todo = todo[~ok]
    if ranked is not None:  # after the random negatives' draws: those are the same under every rule
        row[hard] = _pick(*ranked, mining.rank_range, rng)
    distance = np.linalg.norm(sim[queries] - sim[row], axis=1)
    return MinedNegatives(row=row, is_random=is_random, distance=distance, rate=rate)


#: the arrays of one epoch's record (``negatives/epoch_<NNN>.npz``), one value per training pair, in pair order
RECORD_FIELDS = ("row", "is_random", "rank", "distance", "positive_distance", "positive_of_other")


def negatives_record(sim: np.ndarray, split: PairedSplit, mined: MinedNegatives, block: int | None = None) -> dict:
    """What ``negatives.log=true`` writes for one epoch: per pair (:data:`RECORD_FIELDS`) the negative's ``row`` in
    the split's table, ``is_random``, its ``rank`` (1 + the eligible arguments strictly nearer the point: 1 is the
    hardest eligible one; float64 squared distances, so equal distances share a rank), its ``distance`` to the point
    and the counter's (``positive_distance``), and ``positive_of_other``: its text is the counter (known positive) of
    another pair. Plus ``rate``, the epoch's share of random negatives."""
    sim = np.asarray(sim, dtype=np.float64)
    queries, counters, text_id = split.query, split.counter, split.text_id
    banned = forbidden_texts(split)
    squares = (sim * sim).sum(axis=1)
    rank = np.zeros(len(queries), dtype=np.int64)
    block = block or _row_block(len(sim))
    for start in range(0, len(queries), block):
        part = slice(start, start + block)
        d2 = _squared_distances(sim[queries[part]], sim, squares)  # [B, 2Q]
        own = d2[np.arange(len(d2)), mined.row[part]]
        eligible = _allowed(text_id, banned[part])
        rank[part] = 1 + ((d2 < own[:, None]) & eligible).sum(axis=1)
    return {
        "row": mined.row.astype(np.int64),
        "is_random": mined.is_random.astype(bool),
        "rank": rank,
        "distance": np.asarray(mined.distance, dtype=np.float64),
        "positive_distance": np.linalg.norm(sim[queries] - sim[counters], axis=1),
        "positive_of_other": np.isin(text_id[mined.row], text_id[counters]),
        "rate": np.float64(mined.rate),
    }


def summarise_record(record, previous=None) -> dict[str, float]:
    """One epoch's summary of a :func:`negatives_record` (``biencoder-corpus negatives``): the share of hard
    negatives; the share of negatives (all, and hard ones) whose text is another pair's counter; the hard negatives'
    median rank, median distance, median positive distance and median gap (negative's distance minus the positive's:
    below 0, the negative is nearer the point than its counter); the share of pairs whose negative is the one of the
    ``previous`` epoch's record."""
    hard = ~np.asarray(record["is_random"], dtype=bool)
    other = np.asarray(record["positive_of_other"], dtype=bool)
    gap = np.asarray(record["distance"]) - np.asarray(record["positive_distance"])

    def median(values) -> float:
        return float(np.median(values)) if len(values) else float("nan")

    return {
        "pairs": int(len(hard)),
        "rate": float(record["rate"]),
        "share_hard": float(hard.mean()),
        "share_positive_of_other": float(other.mean()),
        "share_positive_of_other_hard": float(other[hard].mean()) if hard.any() else float("nan"),
        "median_rank_hard": median(np.asarray(record["rank"])[hard]),
        "median_distance_hard": median(np.asarray(record["distance"])[hard]),
        "median_positive_distance": median(np.asarray(record["positive_distance"])),
        "median_gap_hard": median(gap[hard]),
        "share_negative_below_positive_hard": float((gap[hard] < 0).mean()) if hard.any() else float("nan"),
        "share_same_as_previous": float((np.asarray(record["row"]) == np.asarray(previous["row"])).mean())
        if previous is not None
        else float("nan"),
    }
