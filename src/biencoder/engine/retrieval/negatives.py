"""Hard-negative mining over sim embeddings by exact search (or scikit-learn's BallTree), mixed with random negatives.

For every pair's point: the nearest argument of the split, point or counter (by Euclidean distance of the sim
embeddings, one search over all of them: ``negatives.index``), skipping the point itself, its own counter and every
argument whose text equals the point's or the counter's text, is the hard negative. (This is the closer of the
nearest allowed point and the nearest allowed counter; at equal distance the lower row, a point, wins.)
With probability ``random_rate`` a uniformly random eligible argument is taken instead; only the points of the pairs
without a random negative are searched for.

A BEIR split (:class:`~biencoder.engine.data.judged.JudgedSplit`) draws from its documents only
(:attr:`~biencoder.engine.data.paired.PairedSplit.negative_rows`), and a query's negative never has the text of the
query, of its own document or of any document relevant to it (:meth:`~biencoder.engine.data.paired.PairedSplit.
banned_texts`): one negative per query, shared by the triplets of its relevant documents.

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

What ``negatives.log=true`` records of each epoch's negatives is :mod:`.negative_record`.
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
    """[Q, M] text ids a query's negative must not have (:meth:`PairedSplit.banned_texts`; -1 pads): a pair's point's
    and its counter's ([Q, 2]); a judged query's own and every relevant document's (a BEIR split)."""
    return split.banned_texts()


def has_eligible(text_id: np.ndarray, banned: np.ndarray) -> np.ndarray:
    """[Q] bool: some argument's text (``text_id``: those of the rows a negative is drawn from) is none of the query's
    ``banned`` [Q, M] text ids. Only a split of at most M distinct texts can have a query without one."""
    unique = np.unique(text_id)
    if len(unique) > banned.shape[1]:
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


def row_block(n_rows: int) -> int:
    """Queries per block of a full [block, n_rows] float64 distance pass: at most
    :data:`~biencoder.engine.retrieval.search.SEARCH_BLOCK`, and about 4 M distances (32 MB) a block."""
    return max(1, min(SEARCH_BLOCK, (1 << 22) // max(n_rows, 1)))


def squared_distances(points: np.ndarray, sim: np.ndarray, squares: np.ndarray) -> np.ndarray:
    """[B, N] float64 squared Euclidean distances of ``points`` [B, D] to every row of ``sim`` [N, D] (``squares``: the
    rows' squared norms), never below 0."""
    return np.maximum((points * points).sum(axis=1)[:, None] + squares[None, :] - 2.0 * points @ sim.T, 0.0)


def allowed_texts(text_id: np.ndarray, banned: np.ndarray) -> np.ndarray:
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

    One exact float64 pass over every row per block of queries (:func:`row_block`), not a k-nearest search: a margin
    can skip many candidates (with a random head, the counter is often far down the ranking), which would make a
    search's k double up to the whole table, each time from the start."""
    squares = (sim * sim).sum(axis=1)
    need = min(need, len(sim))
    rows = np.full((len(points), need), -1)
    farthest = np.full(len(points), -1)
    size = row_block(len(sim))
    for start in range(0, len(points), size):
        part = slice(start, start + size)
        distance = np.sqrt(squared_distances(points[part], sim, squares))
        allowed = allowed_texts(text_id, banned[part])
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


def _rule_candidates(searched, points, counters, banned, text_id, mining: Mining) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_ranked_allowed` under ``mining``'s rules for the pairs whose point and counter vectors are ``points``
    and ``counters``: each pair's floor of distance (1 + m times its counter's; none without a margin) and the ranks
    a ``rank_range`` draws among."""
    positive = np.linalg.norm(points - counters, axis=1)
    floor = (1.0 + mining.relative_margin) * positive if mining.relative_margin is not None else positive * 0
    need = mining.rank_range[1] if mining.rank_range is not None else 1
    return _ranked_allowed(searched, points, banned, text_id, floor, need)


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
    # the rows a negative is drawn from: every row of a paired split; a BEIR split's documents, never its queries
    pool = split.negative_rows
    whole = len(pool) == len(sim)
    text_id = split.text_id if whole else split.text_id[pool]
    banned = forbidden_texts(split)
    queries = split.query
    if not has_eligible(text_id, banned).all():
        raise ValueError("a pair has no eligible negative: the split needs at least one argument with another text")
    # the draw first, then the search for the hard ones only: a pair that gets a random negative needs no neighbours
    # (most of them early on: rate 0.8 at epoch 0). The search is row by row, so the hard rows are what a search of
    # every pair gives them; the RNG is drawn in the same order as ever
    is_random = rng.random(len(queries)) < rate
    pick = np.full(len(queries), -1)  # places among the searched rows (a BEIR split's documents), -1: none
    hard = np.flatnonzero(~is_random)
    searched, ranked = (sim if whole else sim[pool]), None
    if len(hard) and mining.hardest:
        tree = NeighbourIndex(searched, mining.index, mining.device)
        pick[hard], _ = _first_allowed(tree, sim, queries[hard], banned[hard], text_id, mining.n_neighbors)
    elif len(hard):
        points, counters = sim[queries[hard]], sim[split.counter[hard]]
        ranked = _rule_candidates(searched, points, counters, banned[hard], text_id, mining)
    todo = np.flatnonzero(is_random)
    while len(todo):  # rejection sampling: eligible arguments are the vast majority
        draw = rng.integers(0, len(text_id), size=len(todo))
        ok = np.all(text_id[draw][:, None] != banned[todo], axis=1)
        pick[todo[ok]] = draw[ok]
        todo = todo[~ok]
    if ranked is not None:  # after the random negatives' draws: those are the same under every rule
        pick[hard] = _pick(*ranked, mining.rank_range, rng)
    row = pick if whole else np.where(pick >= 0, pool[pick], -1)
    distance = np.linalg.norm(sim[queries] - sim[row], axis=1)
    return MinedNegatives(row=row, is_random=is_random, distance=distance, rate=rate)
