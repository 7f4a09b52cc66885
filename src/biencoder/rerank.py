"""Retrieve k, then rerank: the per-epoch top-1 of ``../shared/docs/protocol.md``, without Hydra.

For every query point of a split the candidate pool is every argument of the split that belongs to a pair, except
the query itself and the counters whose text equals its true counter's (textual duplicates of the true counter count
as that counter). The k nearest candidates by Euclidean distance of the sim embeddings (``eval.index``: exact
search, the default, or a BallTree; or by the encoder's cosine, ``eval.retrieve=encoder``) are rescored by the
classifier (its logit margin l1 − l0, which orders them as P(positive) does, without float32 ties).
Used by the runner every epoch (:mod:`biencoder.train`), the evaluate app and ``scripts/bench.py``.
"""

from __future__ import annotations

import numpy as np

from .corpus import PairedSplit
from .model import BiModel, Embeddings, pair_margins
from .search import NeighbourIndex


def retrieve(sim: np.ndarray, split: PairedSplit, k: int, index: str = "balltree",
             device="cpu", pairs: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The k nearest candidates per query by sim distance (a BallTree, or exact search, over all rows of ``split``).

    Args: sim [2Q, D]; ``pairs``: the queries (indices of pairs; default all). Returns (rows [P, k'],
    distances [P, k']) nearest first, k' = min(k, smallest pool).
    """
    pairs = np.arange(split.n_pairs) if pairs is None else np.asarray(pairs)
    extra = 1 + int(split.twins_of_true_counter().max())  # the query itself and its true counter's twins
    k = min(k, len(sim) - extra)
    sim = np.asarray(sim, dtype=np.float64)
    dist, rows = NeighbourIndex(sim, index, device).query(sim[split.query[pairs]], k + extra)
    keep = split.is_candidate(rows, pairs)
    # at most `extra` of the k + extra neighbours are dropped, so each query keeps at least k, nearest first
    order = np.argsort(~keep, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(rows, order, 1), np.take_along_axis(dist, order, 1)


def retrieve_rerank(model: BiModel, emb: Embeddings, split: PairedSplit, k: int = 10, batch_size: int = 1024,
                    device="cpu", index: str = "balltree", pairs: np.ndarray | None = None,
                    space: str = "sim") -> tuple[dict[str, float], np.ndarray]:
    """Per-epoch top-1 over every query of ``split`` (or over the queries of ``pairs``, indices of pairs).

    Args: ``emb`` — :class:`Embeddings` of all 2Q rows of ``split`` (computed once per split per epoch); the pool
    of every query is always the whole split. ``space``: where the k come from, ``sim`` (the sim head) or
    ``encoder`` (the encoder's own cosine; see :meth:`Embeddings.retrieval`).
    Returns (metrics, hits): ``top1`` (reranked; ties count against the true counter), ``retrieval_top1``
    (nearest neighbour), ``recall_at_k`` (true counter among the k), ``mrr`` (reciprocal rank of the true
    counter after reranking the k; 0 when it is not among them), ``queries``, ``k``; ``hits`` [Q] bool is the
    reranked top-1 outcome per query.
    """
    pairs = np.arange(split.n_pairs) if pairs is None else np.asarray(pairs)
    rows, _ = retrieve(emb.retrieval(space).numpy(), split, k, index, device, pairs)
    n_q, k_eff = rows.shape
    queries = np.repeat(split.query[pairs], k_eff)
    margins = pair_margins(model, emb, queries, rows.ravel(), batch_size, device).reshape(n_q, k_eff)
    is_true = rows == split.counter[pairs][:, None]
    in_k = is_true.any(axis=1)
    true_margin = np.where(in_k, (margins * is_true).sum(axis=1), -np.inf)
    # rank 1 only if every other retrieved candidate scores strictly lower (by logit margin, see pair_margins)
    rank = 1 + ((margins >= true_margin[:, None]) & ~is_true).sum(axis=1)
    hits = in_k & (rank == 1)
    metrics = {
        "top1": float(hits.mean()),
        "retrieval_top1": float(is_true[:, 0].mean()),
        "recall_at_k": float(in_k.mean()),
        "mrr": float(np.where(in_k, 1.0 / rank, 0.0).mean()),
        "queries": int(n_q),
        "k": int(k_eff),
    }
    return metrics, hits


def seen_unseen(hits: np.ndarray, seen: np.ndarray) -> dict:
    """Top-1 on the unseen and the seen queries (None for an empty group) and their counts.

    Args: ``hits`` [Q] bool (:func:`retrieve_rerank`'s per-query outcome), ``seen`` [Q] bool (the query's point or
    counter text occurs in a training or validation pair: :func:`biencoder.corpus.seen_queries`).
    """
    out = {}
    for group, mask in (("unseen", ~seen), ("seen", seen)):
        out[f"top1_{group}"] = float(hits[mask].mean()) if mask.any() else None
        out[f"queries_{group}"] = int(mask.sum())
    return out
