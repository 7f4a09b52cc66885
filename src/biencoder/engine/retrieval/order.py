"""The retrieval order of the per-epoch pool (``docs/protocol.md``): the first places of each query's pool by
Euclidean distance in the retrieval space, and where its relevant documents stand in that order.

For a query the pool is every row of the split its search draws from (every row, or the positives with
``data.pool=positives``) that :meth:`PairedSplit.is_candidate` admits: never the query itself, never a counter whose
text equals its true counter's. The order is the exact float64 distance's (:class:`~.search.NeighbourIndex`), equal
distances the lower row first.

* :func:`retrieve` gives the k nearest (the shortlist the classifier reranks: :mod:`.rerank`), :func:`retrieve_ranking`
  the first d places in the same order (the final ranking's tail, ``test.run.gz``), :func:`retrieval_order` the
  per-epoch order: the first max(k, 10) places and each relevant document's place up to 100, counted in the same
  search rather than by ordering 100 places.
* :func:`query_blocks` splits the queries so that whatever scores a query against every row holds at most
  :data:`BLOCK_CELLS` cells at once: memory grows linearly with the split.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..data.corpus import PairedSplit
from .metrics import CUT, FINAL_DEPTH, NOT_LISTED
from .search import BEYOND, SEARCH_BLOCK, Counting, NeighbourIndex

NONE = -1  # the row of an empty shortlist place (a pool smaller than k)
#: the most query × row cells scored at once. A block holds a few [B, 2Q] matrices (float64 distances, the 8 tasks'
#: int8 types and bool masks), whatever the split's size: numpy peaked at 153 MB in the 8 tasks' rerank and 70 MB in
#: the baselines (tests/engine/retrieval/test_blocks.py's 3000- and 6000-pair splits). A split of up to 1448 pairs
#: (ArguAna's val and test, the demo) is one block: the whole [Q, 2Q] matrix at once
BLOCK_CELLS = 1 << 22


def query_blocks(n: int, width: int, cells: int = BLOCK_CELLS, multiple: int = 1) -> list[np.ndarray]:
    """``range(n)`` in consecutive blocks of B indices (the last one shorter) for scoring B queries against ``width``
    rows at once: B·width ≤ ``cells``, B at least 1 and a multiple of ``multiple`` (a block then starts at a multiple
    of ``multiple · width`` cells: :func:`biencoder.engine.retrieval.official_tasks.evaluate_tasks` keeps the
    classifier's batches where one [Q, 2Q] pass had them). One block when n·width ≤ cells; one empty block when
    n = 0."""
    size = max(1, cells // max(width, 1))
    size = max(multiple, size - size % multiple)
    return [np.arange(start, min(start + size, n)) for start in range(0, n, size)] or [np.arange(0)]


def retrieve(
    sim: np.ndarray, split: PairedSplit, k: int, index: str, device="cpu", pairs: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The k nearest per-epoch pool members per query (``index``: ``exact`` search or a ``balltree``, over the rows of
    ``split`` its pool draws from: every row, or the positives with ``data.pool=positives``).

    Args: sim [2Q, D] (the retrieval space); ``pairs``: the queries (indices of pairs; default all). Returns (rows
    [P, k'], distances [P, k']) nearest first, k' = min(k, smallest pool).
    """
    sim = np.asarray(sim, dtype=np.float64)
    k = min(k, len(split.pool_rows) - split.search_extra())
    rows, dist, _ = _nearest(_index(sim, split, index, device), sim, split, k, query_pairs(split, pairs))
    return rows, dist


def retrieve_ranking(
    sim: np.ndarray, split: PairedSplit, depth: int, index: str, device="cpu", pairs: np.ndarray | None = None
) -> np.ndarray:
    """[P, d] the first ``depth`` places of each query's per-epoch pool in retrieval order (:func:`retrieve`'s
    search, pool and ties), d = min(``depth``, the largest pool); :data:`NONE` past the end of a smaller pool, so that
    every query lists min(``depth``, its pool) places. The first k' places are :func:`retrieve`'s rows for any
    k ≤ ``depth`` (the search keeps its order however many neighbours it is asked for)."""
    sim = np.asarray(sim, dtype=np.float64)
    tree = _index(sim, split, index, device)
    rows, _, _ = _nearest(tree, sim, split, _depth(split, depth), query_pairs(split, pairs))
    return rows


@dataclass(frozen=True)
class Retrieval:
    """The retrieval order of some queries of a split, as far as the per-epoch metrics read it
    (:func:`retrieval_order`).

    Attributes:
        rows: [P, d] the first d = max(k, :data:`~.metrics.CUT`) places (:func:`retrieve_ranking`'s).
        places: [P, R] the place from 1 of each relevant document (:meth:`PairedSplit.judgements`' order) in the
            whole order, up to :data:`~.metrics.FINAL_DEPTH`; :data:`~.metrics.NOT_LISTED` past it and in the padding.
    """

    rows: np.ndarray
    places: np.ndarray


def retrieval_order(
    sim: np.ndarray, split: PairedSplit, k: int, index: str, device="cpu", pairs: np.ndarray | None = None
) -> Retrieval:
    """The per-epoch retrieval order of the queries ``pairs`` (default all) for a shortlist of ``k``: its first
    max(k, :data:`~.metrics.CUT`) places, and where every relevant document stands in it up to
    :data:`~.metrics.FINAL_DEPTH`, counted in the same search (the candidates ahead of it:
    :meth:`NeighbourIndex.query_ahead`) rather than by ordering 100 places. A relevant document past the first places
    is at the same place in the final ranking (:func:`final_rows` reorders only the shortlist)."""
    sim, pairs = np.asarray(sim, dtype=np.float64), query_pairs(split, pairs)
    relevant, _ = split.judgements(pairs)
    tree = _index(sim, split, index, device)
    rows, _, places = _nearest(tree, sim, split, _depth(split, max(k, CUT)), pairs, relevant)
    return Retrieval(rows, places)


def query_pairs(split: PairedSplit, pairs: np.ndarray | None) -> np.ndarray:
    """``pairs`` (indices of pairs) as an array, or every pair of ``split`` when None."""
    return np.arange(split.n_pairs) if pairs is None else np.asarray(pairs)


def _depth(split: PairedSplit, depth: int) -> int:
    """``depth``, or fewer: the largest pool (the query itself is searched but never a candidate)."""
    return min(depth, len(split.pool_rows) - int(split.pool == "all"))


def _index(sim: np.ndarray, split: PairedSplit, index: str, device) -> NeighbourIndex:
    """A :class:`NeighbourIndex` of ``sim`` [2Q, D] float64's rows that ``split``'s pool draws from
    (``data.pool=positives``: only the positives)."""
    pool = split.pool_rows
    return NeighbourIndex(sim if len(pool) == len(sim) else sim[pool], index, device)


def _nearest(
    tree: NeighbourIndex,
    sim: np.ndarray,
    split: PairedSplit,
    k: int,
    pairs: np.ndarray,
    relevant: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(rows [P, k], distances [P, k], places): the first ``k`` pool members of each query of ``pairs`` by distance
    in ``tree`` (:func:`_index` of ``sim``), nearest first (equal distances the lower row first); :data:`NONE`
    (distance inf) past the end of a pool of fewer than k. With ``relevant`` [P, R] rows (-1: none), ``places`` [P, R]
    is each one's place among its query's candidates (one plus the candidates ahead of it: the rows
    :meth:`NeighbourIndex.query_ahead` counts, less :func:`excluded_rows`), :data:`NOT_LISTED` past
    :data:`FINAL_DEPTH` and in the padding; else None."""
    pool, extra = split.pool_rows, split.search_extra()
    rows, dist, places = [], [], []
    # a block of queries at a time: each query's neighbours are its own (both indexes search row by row), and the
    # k + extra of a block are dropped to k before the next, so a text shared by many pairs (extra ~ Q) costs
    # [SEARCH_BLOCK, k + extra], never [Q, k + extra]
    for block in query_blocks(len(pairs), 1, SEARCH_BLOCK):
        query = sim[split.query[pairs[block]]]
        if relevant is None:
            d, found, _ = tree.query_ahead(query, k + extra)
        else:
            targets, ignore = _searched(pool, relevant[block]), _searched(pool, excluded_rows(split, pairs[block]))
            # more than FINAL_DEPTH - 1 + extra rows ahead: more than FINAL_DEPTH - 1 candidates, so past FINAL_DEPTH
            d, found, ahead = tree.query_ahead(query, k + extra, Counting(targets, ignore, FINAL_DEPTH - 1 + extra))
            place = 1 + ahead
            places.append(np.where((targets >= 0) & (ahead != BEYOND) & (place <= FINAL_DEPTH), place, NOT_LISTED))
        # at most `extra` of the k + extra neighbours are dropped, so a query whose pool has k members keeps k
        r, d = first_kept(pool[found], d, split.is_candidate(pool[found], pairs[block]), k)
        rows.append(r)
        dist.append(d)
    return np.concatenate(rows), np.concatenate(dist), None if relevant is None else np.concatenate(places)


def _searched(pool: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The places of table ``rows`` (-1: none, kept) in the ascending ``pool`` (the index's rows); ValueError for a
    row the pool does not hold."""
    at = np.minimum(np.searchsorted(pool, rows), max(len(pool) - 1, 0))
    given = rows >= 0
    if given.any() and (len(pool) == 0 or (pool[at][given] != rows[given]).any()):
        raise ValueError("a relevant document that the pool does not search")
    return np.where(given, at, -1)


def excluded_rows(split: PairedSplit, pairs: np.ndarray) -> np.ndarray:
    """[P, E] the searched rows that are not candidates of the queries ``pairs`` (:meth:`PairedSplit.is_candidate`
    of their :meth:`PairedSplit.suspect_rows` in the pool), each once, -1 padding."""
    rows = split.suspect_rows(pairs)
    out = np.where((rows >= 0) & np.isin(rows, split.pool_rows) & ~split.is_candidate(rows.clip(0), pairs), rows, -1)
    out = -np.sort(-out, axis=1)  # each query's rows, highest first, -1 last
    out[:, 1:][out[:, 1:] == out[:, :-1]] = -1  # a row twice (a text both the query's and a relevant one's)
    out = -np.sort(-out, axis=1)
    return out[:, : max(int((out >= 0).sum(1).max(initial=0)), 1)]


def first_kept(rows: np.ndarray, dist: np.ndarray, keep: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows [P, k], distances [P, k]): the first k entries of each query's neighbours (rows, distances [P, m],
    nearest first) where ``keep`` [P, m]; :data:`NONE` (distance inf) where fewer than k are kept."""
    order = np.argsort(~keep, axis=1, kind="stable")[:, :k]
    kept = np.take_along_axis(keep, order, 1)
    return (
        np.where(kept, np.take_along_axis(rows, order, 1), NONE),
        np.where(kept, np.take_along_axis(dist, order, 1), np.inf),
    )
