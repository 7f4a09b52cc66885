"""Retrieve k, then rerank: the one retrieve-then-rerank of ``docs/protocol.md`` and the ranks it gives.

For a query the candidates are a pool (the per-epoch pool: every argument of the split that belongs to a pair,
except the query itself and the counters whose text equals its true counter's; or one of the 8 tasks' pools, each a
part of it). The k nearest pool members by Euclidean distance in the retrieval space (the sim embeddings, or the
encoder's cosine with ``eval.retrieve=encoder``; :meth:`Embeddings.retrieval`) are the *shortlist*; the classifier
rescores it by its logit margin l1 − l0 (which orders pairs as P(positive) does, without float32 ties). Equal
distances keep the lower row first; a candidate that ties the true counter ranks above it.

* :func:`retrieve` finds the shortlists of the per-epoch pool with a :class:`NeighbourIndex` (``eval.index``);
  :func:`pool_shortlists` those of arbitrary pools (the 8 tasks) from a block of queries' distances to every row.
* No [Q, 2Q] matrix is held: whatever scores a query against every row does so for a block of queries at a time
  (:func:`query_blocks`, at most :data:`BLOCK_CELLS` cells), so memory grows linearly with the split.
* :func:`shortlist_margins` rescores shortlists, :func:`shortlist_ranks` ranks the true counter in them after
  reranking, :func:`listed_ranks` in their retrieval order.
* :func:`rerank_ranks` gives the per-epoch ranks (the runner every epoch), :func:`retrieve_rerank` their metrics
  (``scripts/bench.py``); :func:`pool_ranks` the 8 tasks' ``rerank`` score
  (:func:`biencoder.engine.retrieval.official_tasks.evaluate_tasks`); the Retriever (:mod:`biencoder.retrieve`)
  reranks its own shortlists with :func:`shortlist_margins`. How they run (k, retrieval space, index, classifier
  batches, device) is a :class:`Rerank`, made once per run from ``eval`` and the runtime.
* The numbers reported from these ranks are :mod:`biencoder.engine.retrieval.metrics`'.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ..config.schema import EvalSchema
from ..data.corpus import PairedSplit
from ..machine.runtime import Runtime, pair_batch_size
from ..modeling.encoding import pair_margins
from ..modeling.model import BiModel, Embeddings
from .metrics import NOT_LISTED, Ranks, epoch_metrics, top1_hits
from .search import SEARCH_BLOCK, NeighbourIndex, distances

#: the false candidates of a block of queries: (indices of pairs [B]) -> name -> [B, 2Q] bool (:func:`pool_ranks`)
PoolMasks = Callable[[np.ndarray], dict[str, np.ndarray]]
NONE = -1  # the row of an empty shortlist place (a pool smaller than k)
#: the most query × row cells scored at once. A block holds a few [B, 2Q] matrices (float64 distances, the 8 tasks'
#: int8 types and bool masks), whatever the split's size: numpy peaked at 153 MB in the 8 tasks' rerank and 70 MB in
#: the baselines (tests/engine/retrieval/test_blocks.py's 3000- and 6000-pair splits). A split of up to 1448 pairs
#: (ArguAna's val and test, the demo) is one block: the whole [Q, 2Q] matrix at once
BLOCK_CELLS = 1 << 22


@dataclass(frozen=True)
class Rerank:
    """How a retrieve-then-rerank runs: the ``k`` nearest in the ``space`` (``sim``, or ``encoder``: the encoder's own
    cosine; :meth:`Embeddings.retrieval`) are shortlisted, by the ``index`` of :func:`retrieve` (``exact`` or
    ``balltree``), then rescored by the classifier in batches of ``batch_size`` pairs (None: the device's,
    :func:`~biencoder.engine.machine.runtime.pair_batch_size`) on ``device``. Where a pool is scored against every row
    (the 8 tasks) ``cells`` query × row cells are scored at once (:func:`query_blocks`): it changes no number but the
    float32 cosine's rounding (a BLAS rounds a row's dot products by where it sits). The defaults are the schema's:
    ``Rerank()`` is what :meth:`of_run` makes of the default config on a CPU."""

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


def query_blocks(n: int, width: int, cells: int = BLOCK_CELLS, multiple: int = 1) -> list[np.ndarray]:
    """``range(n)`` in consecutive blocks of B indices (the last one shorter) for scoring B queries against ``width``
    rows at once: B·width ≤ ``cells``, B at least 1 and a multiple of ``multiple`` (a block then starts at a multiple
    of ``multiple · width`` cells: :func:`biencoder.engine.retrieval.official_tasks.evaluate_tasks` keeps the
    classifier's batches where one [Q, 2Q] pass had them). One block when n·width ≤ cells; one empty block when
    n = 0."""
    size = max(1, cells // max(width, 1))
    size = max(multiple, size - size % multiple)
    return [np.arange(start, min(start + size, n)) for start in range(0, n, size)] or [np.arange(0)]


def pool_mask(split: PairedSplit, pairs: np.ndarray) -> np.ndarray:
    """[B, 2Q] bool: the false candidates of the per-epoch pool (``data.pool``; with ``all`` on ArguAna the epa task's)
    of the queries ``pairs`` [B] (indices of pairs): :meth:`PairedSplit.is_candidate` of every row, less the true
    counter and (a BEIR query) every document relevant to it, so that none counts against the first."""
    pairs = np.asarray(pairs)
    rows = np.broadcast_to(np.arange(len(split.table)), (len(pairs), len(split.table)))
    mask = split.is_candidate(rows, pairs)
    mask[np.arange(len(pairs)), split.counter[pairs]] = False
    return mask & ~split.is_relevant(rows, pairs)


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


def _require_finite(values: np.ndarray, used: np.ndarray, split: str | None, what: str) -> None:
    """:class:`NonFiniteMargins` unless ``values`` is finite wherever ``used`` (bool, same shape) is true."""
    bad = used & ~np.isfinite(values)
    if bad.any():
        raise NonFiniteMargins(int(bad.sum()), int(used.sum()), split, what)


# -- ranks of the whole pool ----------------------------------------------------------------------------------------
def query_ranks(scores: np.ndarray, mask: np.ndarray, true_col: np.ndarray, split: str | None = None) -> np.ndarray:
    """[Q] rank of each true counter given scores [Q, 2Q] (higher = better), candidate mask [Q, 2Q], true columns
    [Q]; a candidate that ties the true counter ranks above it. A non-finite score of a candidate or of a true
    counter is :class:`NonFiniteMargins` (``split`` names it), never a rank."""
    true_score = scores[np.arange(len(true_col)), true_col]
    _require_finite(scores, mask, split, "candidate scores")
    _require_finite(true_score, np.ones(len(true_col), bool), split, "true-counter scores")
    return 1 + (mask & (scores >= true_score[:, None])).sum(axis=1)


# -- shortlists -----------------------------------------------------------------------------------------------------
def retrieve(
    sim: np.ndarray, split: PairedSplit, k: int, index: str, device="cpu", pairs: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The k nearest per-epoch pool members per query (``index``: ``exact`` search or a ``balltree``, over the rows of
    ``split`` its pool draws from: every row, or the positives with ``data.pool=positives``).

    Args: sim [2Q, D] (the retrieval space); ``pairs``: the queries (indices of pairs; default all). Returns (rows
    [P, k'], distances [P, k']) nearest first, k' = min(k, smallest pool).
    """
    pairs = np.arange(split.n_pairs) if pairs is None else np.asarray(pairs)
    pool = split.pool_rows  # data.pool=positives: only the positives are searched
    # what a search may find that the pool leaves out: the query itself (when it is searched), its true counter's twins
    # (a BEIR split: the documents with the query's text or id, the copies of a relevant one; PairedSplit.search_extra)
    extra = split.search_extra()
    sim = np.asarray(sim, dtype=np.float64)
    searched = sim if len(pool) == len(sim) else sim[pool]
    k = min(k, len(searched) - extra)
    tree = NeighbourIndex(searched, index, device)
    rows, dist = [], []
    # a block of queries at a time: each query's neighbours are its own (both indexes search row by row), and the
    # k + extra of a block are dropped to k before the next, so a text shared by many pairs (extra ~ Q) costs
    # [SEARCH_BLOCK, k + extra], never [Q, k + extra]
    for block in query_blocks(len(pairs), 1, SEARCH_BLOCK):
        d, found = tree.query(sim[split.query[pairs[block]]], k + extra)
        r = found if searched is sim else pool[found]
        # at most `extra` of the k + extra neighbours are dropped, so each query keeps at least k, nearest first
        r, d = first_kept(r, d, split.is_candidate(r, pairs[block]), k)
        rows.append(r)
        dist.append(d)
    return np.concatenate(rows), np.concatenate(dist)


def first_kept(rows: np.ndarray, dist: np.ndarray, keep: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows [P, k], distances [P, k]): the first k entries of each query's neighbours (rows, distances [P, m],
    nearest first) where ``keep`` [P, m]; :data:`NONE` (distance inf) where fewer than k are kept."""
    order = np.argsort(~keep, axis=1, kind="stable")[:, :k]
    kept = np.take_along_axis(keep, order, 1)
    return (
        np.where(kept, np.take_along_axis(rows, order, 1), NONE),
        np.where(kept, np.take_along_axis(dist, order, 1), np.inf),
    )


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
    _require_finite(margins, rows != NONE, split, "classifier margins")
    true_margin = np.where(in_k, np.where(is_true, margins, 0).sum(axis=1), np.inf)
    # NaN (empty places, NONE) compares False: never above the true counter
    rank = 1 + ((margins >= true_margin[:, None]) & ~is_true).sum(axis=1)
    return np.where(in_k, rank, NOT_LISTED), in_k


def listed_ranks(rows: np.ndarray, true_rows: np.ndarray) -> np.ndarray:
    """[P] the place from 1 of each true counter ``true_rows`` [P] in its shortlist ``rows`` [P, k] as retrieved
    (nearest first, equal distances the lower row first: :func:`retrieve`), no classifier;
    :data:`~.metrics.NOT_LISTED` (0) where it is not in the shortlist."""
    is_true = rows == np.asarray(true_rows)[:, None]
    before = ((np.cumsum(is_true, axis=1) == 0) & (rows != NONE)).sum(axis=1)
    return np.where(is_true.any(axis=1), before + 1, NOT_LISTED)


def rerank_ranks(
    model: BiModel,
    emb: Embeddings,
    split: PairedSplit,
    rerank: Rerank = SCHEMA_RERANK,
    pairs: np.ndarray | None = None,
    rows: np.ndarray | None = None,
) -> tuple[Ranks, Ranks]:
    """The per-epoch ranks of every query of ``split`` (or of the queries of ``pairs``, indices of pairs).

    Args: ``emb`` — :class:`Embeddings` of all 2Q rows of ``split`` (computed once per split per epoch); the pool
    of every query is always the whole split. ``rerank``: k, where the k come from (``rerank.space``: ``sim``, the sim
    head, or ``encoder``, the encoder's own cosine; see :meth:`Embeddings.retrieval`), the index, the classifier's
    batches and device. ``rows``: the shortlists [P, k'] when they are known already (:func:`retrieve` of the same
    vectors: a frozen encoder's own space is the same every epoch).
    Returns (reranked, retrieved), both listed to the shortlist's depth k' (k, or the smallest pool): the true
    counter's rank after the classifier reranks its shortlist (:func:`shortlist_ranks`: ties count against it), and
    its place in the shortlist's retrieval order (:func:`listed_ranks`).
    Raises: :class:`NonFiniteMargins` for a classifier margin that is NaN or infinite.
    """
    pairs = np.arange(split.n_pairs) if pairs is None else np.asarray(pairs)
    if rows is None:
        rows, _ = retrieve(emb.retrieval(rerank.space).numpy(), split, rerank.k, rerank.index, rerank.device, pairs)
    [margins] = shortlist_margins(model, emb, split.query[pairs], [rows], rerank.batch_size, rerank.device)
    true = split.counter[pairs]
    # a BEIR query's other relevant documents never count against its first (the highest grade): unlisted, NaN
    other = split.is_relevant(rows, pairs) & (rows != true[:, None])
    ranked, margins = np.where(other, NONE, rows), np.where(other, np.float32(np.nan), margins)
    rank, _ = shortlist_ranks(ranked, margins, true, split.name)
    return Ranks(rank, rows.shape[1]), Ranks(listed_ranks(ranked, true), rows.shape[1])


def retrieve_rerank(
    model: BiModel,
    emb: Embeddings,
    split: PairedSplit,
    rerank: Rerank = SCHEMA_RERANK,
    pairs: np.ndarray | None = None,
    rows: np.ndarray | None = None,
) -> tuple[dict[str, float | int | None], np.ndarray]:
    """Per-epoch top-1 over every query of ``split`` (or over the queries of ``pairs``), with :func:`rerank_ranks`'
    arguments. Returns (metrics, hits): :func:`~.metrics.epoch_metrics` of the ranks (``top1``, ``retrieval_top1``,
    ``recall_at_k``, ``mrr``, ``queries``, ``k``), and ``hits`` [P] bool, the reranked top-1 outcome per query."""
    reranked, retrieved = rerank_ranks(model, emb, split, rerank, pairs, rows)
    return epoch_metrics(reranked, retrieved), top1_hits(reranked)


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
    for (name, rows), m in zip(rows_of.items(), margins, strict=False):
        rank, in_k = shortlist_ranks(rows, m, split.counter, split.name)
        ranks[name] = np.where(in_k, rank, np.concatenate(behind[name]))
    return ranks


def fixed_pools(masks: dict[str, np.ndarray]) -> PoolMasks:
    """:func:`pool_ranks`'s ``pools`` from whole masks (name → [Q, 2Q] bool): each block reads its rows."""
    return lambda pairs: {name: mask[pairs] for name, mask in masks.items()}
