"""Ranks over whole pools, the 8 tasks' and the baselines': :func:`query_ranks` from scores of every pool member,
:func:`pool_ranks` by the per-epoch retrieve-then-rerank (:mod:`.rerank`) within each pool (the ``rerank`` score of
:func:`biencoder.engine.retrieval.official_tasks.evaluate_tasks`), :func:`pool_shortlists` the k nearest of each pool
from a block of queries' distances to every row. Pools come a block of queries at a time (:data:`PoolMasks`,
:func:`~.order.query_blocks`), so no [Q, 2Q] matrix is held.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..data.corpus import PairedSplit
from ..modeling.model import BiModel, Embeddings
from .order import NONE, query_blocks
from .rerank import SCHEMA_RERANK, Rerank, require_finite, shortlist_margins, shortlist_ranks
from .search import distances

#: the false candidates of a block of queries: (indices of pairs [B]) -> name -> [B, 2Q] bool (:func:`pool_ranks`)
PoolMasks = Callable[[np.ndarray], dict[str, np.ndarray]]


def query_ranks(scores: np.ndarray, mask: np.ndarray, true_col: np.ndarray, split: str | None = None) -> np.ndarray:
    """[Q] rank of each true counter given scores [Q, 2Q] (higher = better), candidate mask [Q, 2Q], true columns
    [Q]; a candidate that ties the true counter ranks above it. A non-finite score of a candidate or of a true
    counter is :class:`~.rerank.NonFiniteMargins` (``split`` names it), never a rank."""
    true_score = scores[np.arange(len(true_col)), true_col]
    require_finite(scores, mask, split, "candidate scores")
    require_finite(true_score, np.ones(len(true_col), bool), split, "true-counter scores")
    return 1 + (mask & (scores >= true_score[:, None])).sum(axis=1)


def pool_shortlists(dist: np.ndarray, pools: dict[str, np.ndarray], k: int) -> dict[str, np.ndarray]:
    """Per pool, the rows [P, min(k, N)] of its k nearest members (distances ``dist`` [P, N]), nearest first, equal
    distances lower row first; :data:`NONE` fills the places of a pool with fewer than k members.

    ``pools``: name → [P, N] bool, the pool of each query (true counter included)."""
    out = {}
    for name, pool in pools.items():
        d = np.where(pool, dist, np.inf)
        kk = min(k, d.shape[1])
        rows = np.argsort(d, axis=1, kind="stable")[:, :kk]
        out[name] = np.where(np.take_along_axis(pool, rows, 1), rows, NONE)
    return out


def pool_ranks(
    model: BiModel, emb: Embeddings, split: PairedSplit, pools: PoolMasks, rerank: Rerank = SCHEMA_RERANK
) -> dict[str, np.ndarray]:
    """Per pool, [Q] the rank of each query's true counter when its pool is retrieved, then reranked: the k
    nearest (true counter included) by their margins, the rest after them by distance (ties count against).

    ``pools(pairs)``: for the queries ``pairs`` [B] (indices of pairs), name → [B, 2Q] bool, the false candidates of
    each (the 8 tasks': :class:`biencoder.engine.retrieval.official_tasks.TaskPools`; :func:`fixed_pools` wraps whole
    [Q, 2Q] masks). ``rerank``: k, the retrieval space, the classifier's batches and device, and ``cells``. ``pools``
    is called once per block of queries (:func:`query_blocks`, at most ``rerank.cells`` cells): the distances, masks
    and the count of pool members ahead of the true counter live for one block; only the [Q, k] shortlists outlive it,
    and they are reranked in one classifier pass, as one [Q, 2Q] pass would.
    """
    vectors = emb.retrieval(rerank.space).double()  # distances() reads it as it is, once for every block
    shortlists: dict[str, list[np.ndarray]] = {}
    behind: dict[str, list[np.ndarray]] = {}
    for pairs in query_blocks(split.n_pairs, len(split.table), rerank.cells):
        masks, true, at = pools(pairs), split.counter[pairs], np.arange(len(pairs))
        dist = distances(vectors, split.query[pairs])
        true_dist = dist[at, true][:, None]
        for name, mask in masks.items():
            with_true = mask.copy()
            with_true[at, true] = True
            [rows] = pool_shortlists(dist, {name: with_true}, rerank.k).values()
            listed = np.zeros_like(mask)
            np.put_along_axis(listed, np.where(rows == NONE, true[:, None], rows), True, axis=1)
            shortlists.setdefault(name, []).append(rows)
            # not in the shortlist: after all of it, then by distance among the rest of the pool
            behind.setdefault(name, []).append(
                (rows != NONE).sum(axis=1) + 1 + (mask & ~listed & (dist <= true_dist)).sum(axis=1)
            )
    rows_of = {name: np.concatenate(parts) for name, parts in shortlists.items()}
    margins = shortlist_margins(model, emb, split.query, list(rows_of.values()), rerank.batch_size, rerank.device)
    ranks = {}
    for (name, rows), m in zip(rows_of.items(), margins, strict=True):
        rank, in_k = shortlist_ranks(rows, m, split.counter, split.name)
        ranks[name] = np.where(in_k, rank, np.concatenate(behind[name]))
    return ranks


def fixed_pools(masks: dict[str, np.ndarray]) -> PoolMasks:
    """:func:`pool_ranks`'s ``pools`` from whole masks (name → [Q, 2Q] bool): each block reads its rows."""
    return lambda pairs: {name: mask[pairs] for name, mask in masks.items()}
