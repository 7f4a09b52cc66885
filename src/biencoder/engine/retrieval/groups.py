"""The within-group top-1: the per-epoch retrieve-then-rerank (:func:`.rerank.retrieve_rerank`) with each query's pool
cut to the rows of its own group (pair files' ``group`` column: a topic, a debate, a product), the way the ArguAna
tasks cut pools to a debate. Reported per epoch as ``top1_group``, ``recall_at_k_group`` and ``candidates_group``
(false candidates per query), and on test also on the unseen and seen queries.

Each group is searched on its own (:class:`~.search.NeighbourIndex` over its pool rows), so memory follows the
largest group, never the split: no [Q, 2Q] matrix.
"""

from __future__ import annotations

import numpy as np

from ..data.paired import PairedSplit
from ..modeling.model import BiModel, Embeddings
from .metrics import Ranks, group_top1, query_groups, recall_at, top1, top1_hits
from .order import NONE, first_kept
from .rerank import SCHEMA_RERANK, Rerank, shortlist_margins, shortlist_ranks
from .search import NeighbourIndex


def _by_code(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(order, distinct codes, start of each code in ``order``): ``order`` sorts ``codes`` stably."""
    order = np.argsort(codes, kind="stable")
    distinct, start = np.unique(codes[order], return_index=True)
    return order, distinct, np.append(start, len(codes))


def group_shortlists(
    sim: np.ndarray, split: PairedSplit, k: int, index: str, device="cpu", pairs: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(rows [P, k] of each query's k nearest pool members inside its group, nearest first, :data:`NONE`-padded for a
    smaller pool; false candidates [P] in each query's group pool). ``sim`` [2Q, D]: the retrieval space; ``index``:
    ``exact`` or ``balltree``; ``pairs``: the queries (indices of pairs; default all). Same pool rule and ties as
    :func:`.order.retrieve`."""
    codes, text = split.groups, split.text_id
    pairs = np.arange(split.n_pairs) if pairs is None else np.asarray(pairs)
    sim = np.asarray(sim, dtype=np.float64)
    pool = split.pool_rows
    member_order, member_codes, member_start = _by_code(codes[pool])
    query_order, query_codes, query_start = _by_code(codes[split.query[pairs]])
    out, false = np.full((len(pairs), k), NONE), np.zeros(len(pairs), dtype=np.int64)
    twins = int(split.twins_of_true_counter().max())
    for i, code in enumerate(query_codes):
        at = query_order[query_start[i] : query_start[i + 1]]
        j = np.searchsorted(member_codes, code)
        members = pool[member_order[member_start[j] : member_start[j + 1]]]  # ascending: ties keep the lower row
        mine, true = pairs[at], split.counter[pairs[at]]
        searched_self = split.pool == "all"
        dist, found = NeighbourIndex(sim[members], index, device).query(
            sim[split.query[mine]], k + int(searched_self) + twins
        )
        rows = members[found]
        kept, _ = first_kept(rows, dist, split.is_candidate(rows, mine), k)
        out[at, : kept.shape[1]] = kept
        texts, counts = np.unique(text[members[split.is_counter[members]]], return_counts=True)
        same_text = counts[np.searchsorted(texts, text[true])]  # the true counter and its twins in the group
        false[at] = len(members) - int(searched_self) - same_text
    return out, false


def group_rerank(
    model: BiModel,
    emb: Embeddings,
    split: PairedSplit,
    rerank: Rerank = SCHEMA_RERANK,
    pairs: np.ndarray | None = None,
    seen: np.ndarray | None = None,
) -> tuple[dict, np.ndarray]:
    """The within-group top-1 of ``split`` (which has groups) over the queries of ``pairs`` (default all), with
    :func:`.rerank.retrieve_rerank`'s arguments. ``seen`` [P] bool: also on the unseen and seen queries (test).

    Returns (metrics, hits [P] bool): ``top1_group`` and ``recall_at_k_group`` (:mod:`.metrics`' :func:`~.metrics.top1`
    and :func:`~.metrics.recall_at` of the shortlist's depth), ``candidates_group`` (mean false candidates per query
    in its group pool); with ``seen``, ``top1_group_unseen`` / ``top1_group_seen`` (:func:`~.metrics.group_top1`:
    None for an empty group of queries).
    """
    pairs = np.arange(split.n_pairs) if pairs is None else np.asarray(pairs)
    sim = emb.retrieval(rerank.space).numpy()
    rows, false = group_shortlists(sim, split, rerank.k, rerank.index, rerank.device, pairs)
    [margins] = shortlist_margins(model, emb, split.query[pairs], [rows], rerank.batch_size, rerank.device)
    rank, _ = shortlist_ranks(rows, margins, split.counter[pairs], split.name)
    ranks = Ranks(rank, rows.shape[1])
    metrics = {
        "top1_group": top1(ranks),
        "recall_at_k_group": recall_at(ranks, ranks.depth),
        "candidates_group": float(false.mean()),
    }
    if seen is not None:
        metrics.update(group_top1(ranks, query_groups(seen), "top1_group"))
    return metrics, top1_hits(ranks)
