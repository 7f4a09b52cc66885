"""Retrieve k, then rerank: the one retrieve-then-rerank of ``docs/protocol.md`` and the ranks it gives.

For a query the candidates are a pool (the per-epoch pool: every argument of the split that belongs to a pair,
except the query itself and the counters whose text equals its true counter's; or one of the 8 tasks' pools, each a
part of it). The k nearest pool members by Euclidean distance in the retrieval space (the sim embeddings, or the
encoder's cosine with ``eval.retrieve=encoder``; :meth:`Embeddings.retrieval`) are the *shortlist*; the classifier
rescores it by its logit margin l1 − l0 (which orders pairs as P(positive) does, without float32 ties). Equal
distances keep the lower row first; a candidate that ties the true counter ranks above it.

* The shortlists and the retrieval order come from :mod:`.order` (``eval.index``; :func:`~.order.query_blocks` keeps
  whatever scores a query against every row to a block of queries at a time); :mod:`.pools` ranks arbitrary pools
  (the 8 tasks) from a block of queries' distances to every row.
* :func:`shortlist_margins` rescores shortlists, :func:`shortlist_ranks` ranks the true counter in them after
  reranking, :func:`listed_ranks` in their retrieval order; :func:`final_rows` is the final ranking: the reranked
  shortlist, then the retrieval order.
* :func:`rerank_ranks` gives the per-epoch ranks (the runner every epoch), :func:`final_ranking` the final ranking to
  100 places (``test.run.gz``, once per run),
  :func:`retrieve_rerank` their metrics (``scripts/bench.py``); the Retriever (:mod:`biencoder.retrieve`) reranks
  its own shortlists with :func:`shortlist_margins`. How they run (k, retrieval space, index, classifier batches,
  device) is a :class:`Rerank`, made once per run from ``eval`` and the runtime.
* The numbers reported from these ranks are :mod:`biencoder.engine.retrieval.metrics`'.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..config.schema import EvalSchema
from ..data.corpus import PairedSplit
from ..machine.runtime import Runtime, pair_batch_size
from ..modeling.encoding import pair_margins
from ..modeling.model import BiModel, Embeddings
from .metrics import FINAL_DEPTH, NOT_LISTED, Ranks, epoch_metrics, judged_ranks, top1_hits
from .order import BLOCK_CELLS, NONE, Retrieval, query_pairs, retrieval_order, retrieve_ranking


@dataclass(frozen=True)
class Rerank:
    """How a retrieve-then-rerank runs: the ``k`` nearest in the ``space`` (``sim``, or ``encoder``: the encoder's own
    cosine; :meth:`Embeddings.retrieval`) are shortlisted, by the ``index`` of :func:`~.order.retrieve` (``exact`` or
    ``balltree``), then rescored by the classifier in batches of ``batch_size`` pairs (None: the device's,
    :func:`~biencoder.engine.machine.runtime.pair_batch_size`) on ``device``. Where a pool is scored against every row
    (the 8 tasks) ``cells`` query × row cells are scored at once (:func:`~.order.query_blocks`): it changes no number
    but the float32 cosine's rounding (a BLAS rounds a row's dot products by where it sits). The defaults are the
    schema's: ``Rerank()`` is what :meth:`of_run` makes of the default config on a CPU."""

    k: int = EvalSchema.k
    batch_size: int | None = EvalSchema.pair_batch_size
    device: str | torch.device = "cpu"
    index: str = EvalSchema.index
    space: str = EvalSchema.retrieve
    cells: int = BLOCK_CELLS

    def __post_init__(self):
        object.__setattr__(self, "batch_size", pair_batch_size(torch.device(self.device), self.batch_size))

    @classmethod
    def of_run(cls, eval_cfg: EvalSchema, runtime: Runtime) -> Rerank:
        """A run's ``eval.k``, ``eval.pair_batch_size`` (null: the device's, :meth:`Runtime.pair_batch_size`),
        ``eval.index`` and ``eval.retrieve``, on the runtime's device."""
        batch_size = runtime.pair_batch_size(eval_cfg.pair_batch_size)
        return cls(eval_cfg.k, batch_size, runtime.device, eval_cfg.index, eval_cfg.retrieve)


#: the settings of the functions that take a :class:`Rerank` unless told: the schema's, on a CPU
SCHEMA_RERANK = Rerank()


def pool_mask(split: PairedSplit, pairs: np.ndarray) -> np.ndarray:
    """[B, 2Q] bool: the false candidates of the per-epoch pool (``data.pool``; with ``all`` on ArguAna the epa task's)
    of the queries ``pairs`` [B] (indices of pairs): :meth:`PairedSplit.is_candidate` of every row, less every row
    :meth:`PairedSplit.is_relevant` to the query (its true counter; a BEIR query's other relevant documents too, so
    that none counts against the first)."""
    pairs = np.asarray(pairs)
    rows = np.broadcast_to(np.arange(len(split.table)), (len(pairs), len(split.table)))
    return split.is_candidate(rows, pairs) & ~split.is_relevant(rows, pairs)


def query_sample(n: int, size: int | None) -> np.ndarray | None:
    """The queries a split of ``n`` pairs is evaluated on with ``eval.<split>_queries=size``: None (all of them) when
    ``size`` is None or at least ``n``, else ``size`` indices of pairs drawn without replacement by a generator seeded
    0, ascending: the same sample for every seed and cell of a study, so their curves, hits and baselines share it."""
    if size is None or size >= n:
        return None
    return np.sort(np.random.default_rng(0).choice(n, size, replace=False))


class NonFiniteMargins(ValueError):
    """Classifier outputs (or scores) that are NaN or infinite where a rank is read from them: a NaN compares false
    with everything, so it would rank its candidate first. Never ranked; the runner turns it into
    :class:`~biencoder.engine.training.epoch.Diverged` naming the split and the count."""

    def __init__(self, count: int, total: int, split: str | None = None, what: str = "classifier margins"):
        self.count, self.total, self.split, self.what = count, total, split, what
        where = f" on split {split}" if split else ""
        super().__init__(f"{count} of {total} {what}{where} are not finite (NaN or inf): the classifier diverged")


def require_finite(values: np.ndarray, used: np.ndarray, split: str | None, what: str) -> None:
    """:class:`NonFiniteMargins` unless ``values`` is finite wherever ``used`` (bool, same shape) is true."""
    bad = used & ~np.isfinite(values)
    if bad.any():
        raise NonFiniteMargins(int(bad.sum()), int(used.sum()), split, what)


# -- rerank ---------------------------------------------------------------------------------------------------------
def shortlist_margins(
    model: BiModel,
    emb: Embeddings,
    query_rows: np.ndarray,
    shortlists: list[np.ndarray],
    batch_size: int = 1024,
    device="cpu",
) -> list[np.ndarray]:
    """Classifier logit margins [P, k] (float32; NaN at :data:`NONE`) of (query, candidate) for each shortlist
    [P, k] of rows of ``emb``; row i of each shortlist belongs to the query at row ``query_rows[i]``.

    One classifier pass over the union of the shortlists' pairs, in (query, row) order, so a pair in several
    shortlists (the 8 tasks' nested pools) is scored once.
    """
    n = len(emb)
    keys = [np.where(s == NONE, NONE, np.arange(len(s))[:, None] * n + s) for s in shortlists]
    union = sorted_unique(np.concatenate([key[key != NONE] for key in keys]))
    scored = np.append(
        pair_margins(model, emb, np.asarray(query_rows)[union // n], union % n, batch_size, device), np.float32(np.nan)
    )  # the last place: what NONE reads
    return [scored[np.where(key == NONE, len(union), np.searchsorted(union, key))] for key in keys]


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` of a 1-D int array (sorted, distinct) by one sort, without numpy 2's hashing ``unique``
    (BENCHMARKS.md, "Design choices, measured")."""
    ordered = np.sort(values)
    return ordered[np.concatenate([[True], ordered[1:] != ordered[:-1]])] if len(ordered) else ordered


def shortlist_ranks(
    rows: np.ndarray, margins: np.ndarray, true_rows: np.ndarray, split: str | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(rank [P], in_k [P] bool) of each true counter ``true_rows`` [P] in its shortlist ``rows`` [P, k] reranked by
    ``margins`` [P, k]: 1 + the candidates whose margin ties or beats its own; :data:`~.metrics.NOT_LISTED` (0) where
    it is not in the shortlist.

    A margin that is NaN or infinite at a listed place (any row but :data:`NONE`) is an error, never a rank:
    :class:`NonFiniteMargins` with the count (``split`` names the split in its message). A NaN compares false, so
    ranking it would put a NaN true counter first (all-NaN margins: top-1 = recall@k); an error rather than "rank
    last" because non-finite outputs mean the classifier diverged, as a non-finite loss or embedding does.
    """
    is_true = rows == true_rows[:, None]
    in_k = is_true.any(axis=1)
    require_finite(margins, rows != NONE, split, "classifier margins")
    true_margin = np.where(in_k, np.where(is_true, margins, 0).sum(axis=1), np.inf)
    # NaN (empty places, NONE) compares False: never above the true counter
    rank = 1 + ((margins >= true_margin[:, None]) & ~is_true).sum(axis=1)
    return np.where(in_k, rank, NOT_LISTED), in_k


def listed_ranks(rows: np.ndarray, true_rows: np.ndarray) -> np.ndarray:
    """[P] the place from 1 of each true counter ``true_rows`` [P] in its shortlist ``rows`` [P, k] as retrieved
    (nearest first, equal distances the lower row first: :func:`~.order.retrieve`), no classifier;
    :data:`~.metrics.NOT_LISTED` (0) where it is not in the shortlist."""
    is_true = rows == np.asarray(true_rows)[:, None]
    before = ((np.cumsum(is_true, axis=1) == 0) & (rows != NONE)).sum(axis=1)
    return np.where(is_true.any(axis=1), before + 1, NOT_LISTED)


def final_rows(rows: np.ndarray, margins: np.ndarray, true_rows: np.ndarray) -> np.ndarray:
    """[P, d] each query's final ranking: its shortlist (the first k places of its retrieval ranking ``rows``
    [P, d]) reordered by the classifier's ``margins`` [P, k] (finite at every listed place), highest first, then the
    rest of ``rows`` in retrieval order; :data:`NONE` stays in place after every listed row.

    Among equal margins a candidate comes before the true counter ``true_rows`` [P] (ties count against it, as in
    :func:`shortlist_ranks`, whose rank is thus the true counter's place here), and otherwise keeps its retrieval
    order."""
    k = margins.shape[1]
    short = rows[:, :k]
    is_true = short == np.asarray(true_rows)[:, None]
    highest_first = -np.where(short == NONE, -np.inf, margins.astype(np.float64))
    place = np.broadcast_to(np.arange(k), short.shape)
    order = np.lexsort((place, is_true, highest_first), axis=-1)  # the last key sorts first
    return np.concatenate([np.take_along_axis(short, order, 1), rows[:, k:]], axis=1)


@dataclass(frozen=True)
class EpochRanks:
    """The per-epoch ranks of a split's queries (:func:`rerank_ranks`), each [P].

    Attributes:
        reranked: the true counter's rank after the classifier reranks its shortlist (:func:`shortlist_ranks`: ties
            count against it), listed to the shortlist's depth k' (k, or the smallest pool).
        retrieved: its place in the shortlist's retrieval order (:func:`listed_ranks`), to the same depth.
        final: every relevant document's place in the final ranking (:func:`final_ranking`: the reranked shortlist,
            then the retrieval order), listed to max(k, :data:`~.metrics.FINAL_DEPTH`) places.
    """

    reranked: Ranks
    retrieved: Ranks
    final: Ranks


def rerank_ranks(
    model: BiModel,
    emb: Embeddings,
    split: PairedSplit,
    rerank: Rerank = SCHEMA_RERANK,
    pairs: np.ndarray | None = None,
    order: Retrieval | None = None,
) -> EpochRanks:
    """The per-epoch ranks of every query of ``split`` (or of the queries of ``pairs``, indices of pairs).

    Args: ``emb`` — :class:`Embeddings` of all 2Q rows of ``split`` (computed once per split per epoch); the pool
    of every query is always the whole split. ``rerank``: k, where the k come from (``rerank.space``: ``sim``, the sim
    head, or ``encoder``, the encoder's own cosine; see :meth:`Embeddings.retrieval`), the index, the classifier's
    batches and device. ``order``: the queries' :func:`retrieval_order` when it is known already (a frozen encoder's
    own space is the same every epoch).
    Returns :class:`EpochRanks`: the classifier reranks the first k' places of each retrieval order (k' = min(k,
    smallest pool), :func:`~.order.retrieve`'s shortlist); the final ranking puts them before the rest.
    Raises: :class:`NonFiniteMargins` for a classifier margin that is NaN or infinite.
    """
    pairs = query_pairs(split, pairs)
    if order is None:
        space = emb.retrieval(rerank.space).numpy()
        order = retrieval_order(space, split, rerank.k, rerank.index, rerank.device, pairs)
    short, margins = _rescored(model, emb, split, rerank, pairs, order.rows)
    true = split.counter[pairs]
    # a BEIR query's other relevant documents never count against its first (the highest grade): unlisted, NaN
    other = split.is_relevant(short, pairs) & (short != true[:, None])
    ranked = np.where(other, NONE, short)
    rank, _ = shortlist_ranks(ranked, np.where(other, np.float32(np.nan), margins), true, split.name)
    k = short.shape[1]
    # the final ranking is judged by every relevant document with its grade (nDCG's gains; a counter alone: grade 1):
    # where its first places do not list one, the retrieval order's place of it is its place
    relevant, grade = split.judgements(pairs)
    first = judged_ranks(final_rows(order.rows, margins, true), relevant, grade, order.rows.shape[1]).rank
    final = Ranks(np.where(first == NOT_LISTED, order.places, first), max(rerank.k, FINAL_DEPTH), grade)
    return EpochRanks(Ranks(rank, k), Ranks(listed_ranks(ranked, true), k), final)


def final_ranking(
    model: BiModel,
    emb: Embeddings,
    split: PairedSplit,
    rerank: Rerank = SCHEMA_RERANK,
    pairs: np.ndarray | None = None,
) -> np.ndarray:
    """[P, d] each query's final ranking (:func:`final_rows`), d = max(k, :data:`~.metrics.FINAL_DEPTH`) places: the
    reranked shortlist, then the retrieval order (``test.run.gz``; :func:`rerank_ranks`' arguments)."""
    pairs = query_pairs(split, pairs)
    space = emb.retrieval(rerank.space).numpy()
    rows = retrieve_ranking(space, split, max(rerank.k, FINAL_DEPTH), rerank.index, rerank.device, pairs)
    _, margins = _rescored(model, emb, split, rerank, pairs, rows)
    return final_rows(rows, margins, split.counter[pairs])


def _rescored(
    model: BiModel, emb: Embeddings, split: PairedSplit, rerank: Rerank, pairs: np.ndarray, rows: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(shortlists [P, k'], their classifier margins [P, k']): the first k' = min(k, smallest pool) places of each
    retrieval order ``rows`` [P, d] of the queries ``pairs``."""
    short = rows[:, : min(rerank.k, len(split.pool_rows) - split.search_extra())]
    [margins] = shortlist_margins(model, emb, split.query[pairs], [short], rerank.batch_size, rerank.device)
    return short, margins


def retrieve_rerank(
    model: BiModel,
    emb: Embeddings,
    split: PairedSplit,
    rerank: Rerank = SCHEMA_RERANK,
    pairs: np.ndarray | None = None,
    order: Retrieval | None = None,
) -> tuple[dict[str, float | int | None], np.ndarray]:
    """Per-epoch top-1 over every query of ``split`` (or over the queries of ``pairs``), with :func:`rerank_ranks`'
    arguments. Returns (metrics, hits): :func:`~.metrics.epoch_metrics` of the ranks (``top1``, ``retrieval_top1``,
    ``recall_at_k``, ``mrr``, ``queries``, ``k``, ``ndcg_at_10``, ``mrr_at_10``, ``recall_at_100``), and ``hits`` [P]
    bool, the reranked top-1 outcome per query."""
    ranks = rerank_ranks(model, emb, split, rerank, pairs, order)
    return epoch_metrics(ranks.reranked, ranks.retrieved, ranks.final), top1_hits(ranks.reranked)
