"""The numbers a run reports from ranks: every rank metric of ``metrics.jsonl``, the 8 tasks, the baselines and their
unseen/seen splits is defined here, once, as a function of :class:`Ranks`.

A :class:`Ranks` holds, per query, the rank from 1 of its true counter in one ranking of its candidates, made where the
candidates are scored (:func:`~biencoder.engine.retrieval.rerank.shortlist_ranks`,
:func:`~biencoder.engine.retrieval.rerank.listed_ranks`, :func:`~biencoder.engine.retrieval.rerank.pool_ranks`,
:func:`~biencoder.engine.retrieval.rerank.query_ranks`). Everything that decides a rank is settled there, before a
metric reads it: which rows are candidates (never the query itself, never a counter with the true counter's text: a
duplicate of the answer is the answer) and how ties fall (a candidate that ties the true counter's score or margin
ranks above it; in the retrieval order, equal distances keep the lower row first). A ranking may list only its first
``depth`` places (the per-epoch shortlist of k); a true counter outside them has rank :data:`NOT_LISTED`. The per-epoch
ranking is the final one up to its depth: the reranked shortlist, whose places come before every unlisted candidate.

Every metric averages over *every* query of its :class:`Ranks` (a not-listed counter counts as a miss, never as a
query left out) and is None for no queries. A metric is one function of a :class:`Ranks` here, and the records
(:func:`epoch_metrics`, :func:`task_metrics`, :func:`group_top1`) say which of them each report carries.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: the rank of a true counter that is not among the places a ranking lists (outside the per-epoch shortlist)
NOT_LISTED = 0


@dataclass(frozen=True)
class Ranks:
    """The ranks of the true counters of Q queries in one ranking each.

    Args:
        rank: [Q] int, from 1 (1: the true counter comes first; ties already counted against it), or
            :data:`NOT_LISTED` where the true counter is past the listed places.
        depth: how many places of each ranking are listed (the shortlist's k): every rank is at most ``depth``;
            None when the whole pool is ranked, so that every rank is known (none is :data:`NOT_LISTED`).
    Raises:
        ValueError: ``rank`` is not a 1-D integer array, has a rank below 0 or above ``depth``, or has a
            :data:`NOT_LISTED` rank while ``depth`` is None.
    """

    rank: np.ndarray
    depth: int | None = None

    def __post_init__(self):
        rank = np.asarray(self.rank)
        if rank.ndim != 1 or not np.issubdtype(rank.dtype, np.integer):
            raise ValueError(f"ranks must be a 1-D integer array, not {rank.dtype} of shape {rank.shape}")
        lowest = 1 if self.depth is None else NOT_LISTED
        if len(rank) and (rank.min() < lowest or (self.depth is not None and rank.max() > self.depth)):
            listed = "every place" if self.depth is None else f"{self.depth} places"
            raise ValueError(
                f"ranks from {rank.min()} to {rank.max()} in a ranking that lists {listed}: a rank is 1 or more, "
                f"at most the depth, or {NOT_LISTED} (not listed) when only some places are listed"
            )
        object.__setattr__(self, "rank", rank)

    def __len__(self) -> int:
        return len(self.rank)

    def of(self, queries: np.ndarray) -> Ranks:
        """The ranks of the queries where ``queries`` ([Q] bool) is true, in the same ranking (the same depth).
        ValueError when ``queries`` is not a [Q] bool mask of these queries."""
        queries = np.asarray(queries)
        if queries.dtype != bool or queries.shape != self.rank.shape:
            raise ValueError(f"a group of queries is a [{len(self)}] bool mask, not {queries.dtype} {queries.shape}")
        return Ranks(self.rank[queries], self.depth)


def top1_hits(ranks: Ranks) -> np.ndarray:
    """[Q] bool: the true counter ranks first (``test_hits.npy``, the paired comparisons' per-query outcome)."""
    return ranks.rank == 1


def top1(ranks: Ranks) -> float | None:
    """Top-1 (accuracy@1): the share of the queries whose true counter ranks first, over every query; None for
    none."""
    return float(top1_hits(ranks).mean()) if len(ranks) else None


def recall_at(ranks: Ranks, n: int) -> float | None:
    """Recall@n: the share of the queries whose true counter ranks in the first ``n`` places, over every query; None
    for none. ``recall_at(ranks, ranks.depth)`` is the per-epoch ``recall_at_k``: the true counter is in the shortlist.

    Raises:
        ValueError: ``n`` is below 1, or past ``ranks.depth``: a counter at a place the ranking does not list would
            count as absent, so a deeper recall needs a deeper ranking.
    """
    if n < 1 or (ranks.depth is not None and n > ranks.depth):
        listed = "every place" if ranks.depth is None else f"{ranks.depth} places"
        raise ValueError(f"recall@{n} of a ranking that lists {listed}")
    return float(((ranks.rank >= 1) & (ranks.rank <= n)).mean()) if len(ranks) else None


def mrr(ranks: Ranks) -> float | None:
    """Mean reciprocal rank: the mean over every query of 1 / rank, 0 for a :data:`NOT_LISTED` counter (so on a
    ranking listed to depth d it is MRR@d); None for no queries."""
    if not len(ranks):
        return None
    listed = ranks.rank != NOT_LISTED
    return float(np.where(listed, 1.0 / np.maximum(ranks.rank, 1), 0.0).mean())


def epoch_metrics(reranked: Ranks, retrieved: Ranks) -> dict[str, float | int | None]:
    """The rank metrics of one ``metrics.jsonl`` row (docs/protocol.md, "The per-epoch top-1").

    Args: ``reranked`` [Q]: the ranks after the classifier reranks the shortlist of each query; ``retrieved`` [Q]:
    the ranks in the same shortlist's retrieval order (nearest first); both listed to the shortlist's depth k.
    Returns: ``top1`` (reranked), ``retrieval_top1``, ``recall_at_k`` (the true counter is in the shortlist),
    ``mrr`` (reranked; 0 outside the shortlist), ``queries`` (Q) and ``k`` (the depth).
    """
    if reranked.depth is None or len(reranked) != len(retrieved) or reranked.depth != retrieved.depth:
        raise ValueError("the reranked and retrieved ranks must be of the same queries and the same shortlists")
    return {
        "top1": top1(reranked),
        "retrieval_top1": top1(retrieved),
        "recall_at_k": recall_at(reranked, reranked.depth),
        "mrr": mrr(reranked),
        "queries": len(reranked),
        "k": reranked.depth,
    }


def task_metrics(ranks: Ranks) -> dict[str, float | None]:
    """The rank metrics of one of the 8 tasks (or of one group of its queries): ``accuracy_at_1`` (:func:`top1`) and
    ``mrr`` of ranks over the whole pool."""
    return {"accuracy_at_1": top1(ranks), "mrr": mrr(ranks)}


def query_groups(seen: np.ndarray) -> dict[str, np.ndarray]:
    """The two query groups every test number is reported on: ``{"unseen": [Q] bool, "seen": [Q] bool}`` from
    ``seen`` [Q] bool (the query's point or counter text occurs in a training or validation pair:
    :func:`biencoder.engine.data.paired.seen_queries`)."""
    seen = np.asarray(seen, dtype=bool)
    return {"unseen": ~seen, "seen": seen}


def by_group(ranks: Ranks, groups: dict[str, np.ndarray]) -> dict[str, Ranks]:
    """Group name → the :class:`Ranks` of its queries (``groups``: name → [Q] bool), in the order of ``groups``."""
    return {name: ranks.of(mask) for name, mask in groups.items()}


def group_top1(
    ranks: Ranks, groups: dict[str, np.ndarray], key: str = "top1", counts: bool = False
) -> dict[str, float | int | None]:
    """Per group of queries (``groups``: name → [Q] bool), ``<key>_<name>``: the :func:`top1` of its queries alone
    (None for an empty group), and with ``counts`` ``queries_<name>``: how many, in the order of ``groups``."""
    out: dict[str, float | int | None] = {}
    for name, group in by_group(ranks, groups).items():
        out[f"{key}_{name}"] = top1(group)
        if counts:
            out[f"queries_{name}"] = len(group)
    return out
