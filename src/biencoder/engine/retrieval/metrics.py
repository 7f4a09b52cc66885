"""The numbers a run reports from ranks: every rank metric of ``metrics.jsonl``, the 8 tasks, the baselines and their
unseen/seen splits is defined here, once, as a function of :class:`Ranks`.

A :class:`Ranks` holds, per query, the rank from 1 of its true counter in one ranking of its candidates, made where the
candidates are scored (:func:`~biencoder.engine.retrieval.rerank.shortlist_ranks`,
:func:`~biencoder.engine.retrieval.rerank.listed_ranks`, :func:`~biencoder.engine.retrieval.pools.pool_ranks`,
:func:`~biencoder.engine.retrieval.pools.query_ranks`). Everything that decides a rank is settled there, before a
metric reads it: which rows are candidates (never the query itself, never a counter with the true counter's text: a
duplicate of the answer is the answer) and how ties fall (a candidate that ties the true counter's score or margin
ranks above it; in the retrieval order, equal distances keep the lower row first). A ranking may list only its first
``depth`` places (the per-epoch shortlist of k); a true counter outside them has rank :data:`NOT_LISTED`. The per-epoch
ranking is the final one up to its depth: the reranked shortlist, whose places come before every unlisted candidate.

Every metric averages over *every* query of its :class:`Ranks` (a not-listed counter counts as a miss, never as a
query left out) and is None for no queries. A metric is one function of a :class:`Ranks` here, and the records
(:func:`epoch_metrics`, :func:`task_metrics`, :func:`group_top1`) say which of them each report carries.

The field's metrics (:func:`ndcg_at`, :func:`mrr_at`, :func:`recall_at`) are read from the *final ranking*
(:func:`~biencoder.engine.retrieval.rerank.final_rows`: the reranked shortlist, then the retrieval order) and are
trec_eval's, so that a TREC run file of that ranking (:mod:`biencoder.engine.runs.trec`) gives the same numbers in
trec_eval, ir-measures or ranx. A :class:`Ranks` may judge several relevant documents per query with graded relevance
(``grade``); one true counter per query is the case of one document of grade 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: the rank of a true counter that is not among the places a ranking lists (outside the per-epoch shortlist)
NOT_LISTED = 0
#: the places of the final ranking the field's metrics need (``recall_at_100``) and a TREC run file lists per query
FINAL_DEPTH = 100
#: the places ``ndcg_at_10`` and ``mrr_at_10`` read
CUT = 10


@dataclass(frozen=True)
class Ranks:
    """The ranks of the relevant documents (the true counters) of Q queries in one ranking each.

    Args:
        rank: [Q] int: the rank from 1 of each query's one relevant document (its true counter, grade 1; 1: it comes
            first; ties already counted against it), or :data:`NOT_LISTED` where it is past the listed places. Or
            [Q, R] int with ``grade``: the places of up to R relevant documents per query, each query's in distinct
            places (a ranking holds one document per place), :data:`NOT_LISTED` where one is not listed and in the
            padding.
        depth: how many places of each ranking are listed (the shortlist's k, the final ranking's 100): every rank is
            at most ``depth``, and a ranking lists fewer only when its pool has fewer candidates; None when the whole
            pool is ranked, so that every rank of a relevant document is known (none is :data:`NOT_LISTED`).
        grade: None for [Q] ranks; for [Q, R] ranks, [Q, R] int: each relevant document's relevance (> 0, as a qrels
            file grades it: nDCG's gain), 0 for the padding of a query with fewer than R; every query has at least one
            document of grade > 0.
    Raises:
        ValueError: ``rank`` is neither a 1-D integer array nor a 2-D one with ``grade`` of its shape, has a rank
            below 0 or above ``depth``, a :data:`NOT_LISTED` rank of a relevant document while ``depth`` is None, a
            listed place in the padding, two relevant documents of a query in one place, or a query without a
            relevant document.
    """

    rank: np.ndarray
    depth: int | None = None
    grade: np.ndarray | None = None

    def __post_init__(self):
        rank = np.asarray(self.rank)
        grade = None if self.grade is None else np.asarray(self.grade)
        if not np.issubdtype(rank.dtype, np.integer) or rank.ndim != (1 if grade is None else 2):
            raise ValueError(
                f"ranks must be a 1-D integer array (or [Q, R] with grades), not {rank.dtype} of shape {rank.shape}"
            )
        relevant = None if grade is None else _check_grades(rank, grade)
        lowest = 1 if self.depth is None else NOT_LISTED
        judged = rank if relevant is None else rank[relevant]
        if len(judged) and (judged.min() < lowest or (self.depth is not None and judged.max() > self.depth)):
            listed = "every place" if self.depth is None else f"{self.depth} places"
            raise ValueError(
                f"ranks from {judged.min()} to {judged.max()} in a ranking that lists {listed}: a rank is 1 or more, "
                f"at most the depth, or {NOT_LISTED} (not listed) when only some places are listed"
            )
        object.__setattr__(self, "rank", rank)
        object.__setattr__(self, "grade", grade)

    def __len__(self) -> int:
        return len(self.rank)

    def of(self, queries: np.ndarray) -> Ranks:
        """The ranks of the queries where ``queries`` ([Q] bool) is true, in the same ranking (the same depth).
        ValueError when ``queries`` is not a [Q] bool mask of these queries."""
        queries = np.asarray(queries)
        if queries.dtype != bool or queries.shape != (len(self),):
            raise ValueError(f"a group of queries is a [{len(self)}] bool mask, not {queries.dtype} {queries.shape}")
        return Ranks(self.rank[queries], self.depth, None if self.grade is None else self.grade[queries])

    def judged(self) -> tuple[np.ndarray, np.ndarray]:
        """(rank [Q, R], grade [Q, R]): every query's relevant documents as [Q, R] arrays, [Q] ranks as R = 1 of
        grade 1."""
        if self.grade is None:
            return self.rank[:, None], np.ones((len(self), 1), dtype=np.int64)
        return self.rank, self.grade


def judged_ranks(rows: np.ndarray, relevant: np.ndarray, grade: np.ndarray, depth: int | None) -> Ranks:
    """Graded :class:`Ranks` of rankings ``rows`` [P, d] (table rows, best first; -1 past a ranking's end) judged by
    ``relevant`` [P, R] rows with ``grade`` [P, R] (0: padding): each relevant row's place from 1, or
    :data:`NOT_LISTED` where the ranking does not list it; listed to ``depth`` places."""
    rows, relevant, grade = np.asarray(rows), np.asarray(relevant), np.asarray(grade)
    hit = (rows[:, None, :] == relevant[:, :, None]) & (grade > 0)[:, :, None]
    return Ranks(np.where(hit.any(axis=2), hit.argmax(axis=2) + 1, NOT_LISTED), depth, grade)


def _check_grades(rank: np.ndarray, grade: np.ndarray) -> np.ndarray:
    """[Q, R] bool, where a relevant document is (grade > 0), after checking ``grade`` against ``rank`` [Q, R]
    (:class:`Ranks`' rules); ValueError naming the first rule broken."""
    if grade.shape != rank.shape or not np.issubdtype(grade.dtype, np.integer) or (grade < 0).any():
        raise ValueError(
            f"grades must be integers >= 0 of the ranks' shape {rank.shape}, not {grade.dtype} {grade.shape}"
        )
    relevant = grade > 0
    if len(rank) and not relevant.any(axis=1).all():
        raise ValueError(
            "every query needs a relevant document (grade > 0): a query without one has no recall or nDCG"
        )
    if (rank[~relevant] != NOT_LISTED).any():
        raise ValueError(f"a place of grade 0 is padding: its rank is {NOT_LISTED}")
    places = np.sort(np.where(relevant, rank, NOT_LISTED), axis=1)
    if ((places[:, 1:] == places[:, :-1]) & (places[:, 1:] != NOT_LISTED)).any():
        raise ValueError("two relevant documents of a query in one place: a ranking holds one document per place")
    return relevant


def top1_hits(ranks: Ranks) -> np.ndarray:
    """[Q] bool: a relevant document (the true counter) ranks first (``test_hits.npy``, the paired comparisons'
    per-query outcome)."""
    if ranks.grade is None:
        return ranks.rank == 1
    rank, grade = ranks.judged()
    return ((rank == 1) & (grade > 0)).any(axis=1)


def top1(ranks: Ranks) -> float | None:
    """Top-1 (accuracy@1): the share of the queries whose true counter ranks first, over every query; None for
    none."""
    return float(top1_hits(ranks).mean()) if len(ranks) else None


def _check_cut(ranks: Ranks, n: int, metric: str) -> None:
    """ValueError unless the first ``n`` places of ``ranks``' rankings are listed: ``n`` is 1 or more and at most
    the depth (a relevant document at a place the ranking does not list would count as absent)."""
    if n < 1 or (ranks.depth is not None and n > ranks.depth):
        listed = "every place" if ranks.depth is None else f"{ranks.depth} places"
        raise ValueError(f"{metric}@{n} of a ranking that lists {listed}")


def _within(ranks: Ranks, n: float) -> tuple[np.ndarray, np.ndarray]:
    """(found [Q, R] bool: a relevant document ranked in the first ``n`` places; grade [Q, R])."""
    rank, grade = ranks.judged()
    return (grade > 0) & (rank >= 1) & (rank <= n), grade


def recall_at(ranks: Ranks, n: int) -> float | None:
    """Recall@n (trec_eval's ``recall.n``): per query the share of its relevant documents ranked in the first ``n``
    places, averaged over every query; None for none. With one true counter per query it is the share of the queries
    whose counter ranks in the first ``n``: ``recall_at(ranks, ranks.depth)`` is the per-epoch ``recall_at_k`` (the
    true counter is in the shortlist), ``recall_at(final, 100)`` the final ranking's ``recall_at_100``.

    Raises:
        ValueError: ``n`` is below 1, or past ``ranks.depth``: a counter at a place the ranking does not list would
            count as absent, so a deeper recall needs a deeper ranking.
    """
    _check_cut(ranks, n, "recall")
    if not len(ranks):
        return None
    if ranks.grade is None:
        return float(((ranks.rank >= 1) & (ranks.rank <= n)).mean())
    found, grade = _within(ranks, n)
    return float((found.sum(axis=1) / (grade > 0).sum(axis=1)).mean())


def _reciprocal_ranks(ranks: Ranks, n: float) -> np.ndarray:
    """[Q] float: 1 / the place of each query's first relevant document when it is in the first ``n`` places, else
    0."""
    found, _ = _within(ranks, n)
    rank, _ = ranks.judged()
    first = np.where(found, rank, np.iinfo(np.int64).max).min(axis=1)
    return np.where(found.any(axis=1), 1.0 / np.maximum(first, 1), 0.0)


def mrr(ranks: Ranks) -> float | None:
    """Mean reciprocal rank: the mean over every query of 1 / the rank of its first relevant document (the true
    counter), 0 for a :data:`NOT_LISTED` one (so on a ranking listed to depth d it is MRR@d: :func:`mrr_at` of d);
    None for no queries."""
    if not len(ranks):
        return None
    if ranks.grade is None:
        listed = ranks.rank != NOT_LISTED
        return float(np.where(listed, 1.0 / np.maximum(ranks.rank, 1), 0.0).mean())
    return float(_reciprocal_ranks(ranks, np.inf).mean())


def mrr_at(ranks: Ranks, n: int) -> float | None:
    """MRR@n (trec_eval's ``recip_rank`` of the first ``n`` places; ir-measures' ``RR@n``): the mean over every query
    of 1 / the place of its first relevant document when that place is at most ``n``, else 0 (a counter at place
    n + 1 counts 0); None for no queries. ValueError for ``n`` below 1 or past ``ranks.depth``."""
    _check_cut(ranks, n, "MRR")
    return float(_reciprocal_ranks(ranks, n).mean()) if len(ranks) else None


def ndcg_at(ranks: Ranks, n: int) -> float | None:
    """nDCG@n (trec_eval's ``ndcg_cut.n``; ir-measures' ``nDCG@n``): per query DCG@n / ideal DCG@n, averaged over
    every query; None for no queries.

    DCG@n sums, over the relevant documents ranked in the first ``n`` places, grade / log2(1 + place) (a linear gain,
    trec_eval's: grade 2 counts twice grade 1); the ideal DCG@n is the same sum over the query's relevant documents
    sorted by grade, best first, in places 1, 2, ... (at most ``n`` of them, the unlisted ones included). With one
    true counter per query: 1 / log2(1 + rank) when it ranks in the first ``n``, else 0.
    ValueError for ``n`` below 1 or past ``ranks.depth``.
    """
    _check_cut(ranks, n, "nDCG")
    if not len(ranks):
        return None
    found, grade = _within(ranks, n)
    rank, _ = ranks.judged()
    dcg = np.where(found, grade / np.log2(1.0 + np.maximum(rank, 1)), 0.0).sum(axis=1)
    best = -np.sort(-grade, axis=1)[:, :n]
    ideal = (best / np.log2(2.0 + np.arange(best.shape[1]))).sum(axis=1)
    return float((dcg / ideal).mean())


def epoch_metrics(reranked: Ranks, retrieved: Ranks, final: Ranks) -> dict[str, float | int | None]:
    """The rank metrics of one ``metrics.jsonl`` row (docs/protocol.md, "The per-epoch top-1").

    Args: ``reranked`` [Q]: the ranks after the classifier reranks the shortlist of each query; ``retrieved`` [Q]:
    the ranks in the same shortlist's retrieval order (nearest first); both listed to the shortlist's depth k.
    ``final`` [Q]: the ranks in the final ranking of the same queries (the reranked shortlist, then the retrieval
    order: :func:`~biencoder.engine.retrieval.rerank.final_rows`), listed to :data:`FINAL_DEPTH` places or more.
    Returns: ``top1`` (reranked), ``retrieval_top1``, ``recall_at_k`` (the true counter is in the shortlist),
    ``mrr`` (reranked; 0 outside the shortlist), ``queries`` (Q), ``k`` (the depth), then the field's metrics of the
    final ranking: ``ndcg_at_10`` (:func:`ndcg_at`), ``mrr_at_10`` (:func:`mrr_at`), ``recall_at_100``
    (:func:`recall_at`).
    """
    if reranked.depth is None or len(reranked) != len(retrieved) or reranked.depth != retrieved.depth:
        raise ValueError("the reranked and retrieved ranks must be of the same queries and the same shortlists")
    if len(final) != len(reranked) or final.depth is None or final.depth < max(reranked.depth, FINAL_DEPTH):
        raise ValueError(f"the final ranks must be of the same queries, listed to {FINAL_DEPTH} places or more")
    return {
        "top1": top1(reranked),
        "retrieval_top1": top1(retrieved),
        "recall_at_k": recall_at(reranked, reranked.depth),
        "mrr": mrr(reranked),
        "queries": len(reranked),
        "k": reranked.depth,
        "ndcg_at_10": ndcg_at(final, CUT),
        "mrr_at_10": mrr_at(final, CUT),
        "recall_at_100": recall_at(final, FINAL_DEPTH),
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
