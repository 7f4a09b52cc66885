"""The eight official tasks of Wachsmuth, Syed & Stein (ACL 2018): sdoc, sdc, sdoa, sda, stc, sta, epc, epa.

Queries: every point that has a counter. True candidate: its counter. False candidates: arguments that belong
to pairs, never the query itself, never a counter whose text equals the true counter's text; typed relative
to the query (see :data:`TYPES`); each task is a union of types. Accuracy@1 counts a query when its true
counter scores strictly higher than every false candidate (ties count against it); MRR uses the same ranks.

Scores are computed for whole blocks of queries at once (never per pair, never a pairs × candidates × features tensor,
never the whole [Q, 2Q] matrix of a large split): the memory held is a few [B, 2Q] matrices (float64 distances, float32
scores, the types and masks) for B·2Q ≤ :data:`~biencoder.engine.retrieval.order.BLOCK_CELLS`, so it grows linearly
with the split (the time, every query against every row, quadratically). The ``rerank`` score is
:mod:`biencoder.engine.retrieval.rerank`'s retrieve-then-rerank over each task's pool.

Command line: ``python -m biencoder.tasks <root> --split test [--json]`` prints pool sizes per task.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pandas as pd
import torch

from ..data.corpus import PairedSplit
from ..modeling.model import BiModel, Embeddings
from .metrics import Ranks, by_group, task_metrics
from .order import BLOCK_CELLS, query_blocks
from .pools import PoolMasks, pool_ranks, query_ranks
from .rerank import SCHEMA_RERANK, Rerank, pool_mask, shortlist_margins
from .search import distances

TYPES = (
    "debate-same-counter",
    "debate-oppo-counter",
    "debate-oppo-point",
    "debate-same-point",
    "theme-counter",
    "theme-point",
    "portal-counter",
    "portal-point",
)
TASKS = {
    "sdoc": ("debate-same-counter",),
    "sdc": ("debate-same-counter", "debate-oppo-counter"),
    "sdoa": ("debate-same-counter", "debate-oppo-point"),
    "sda": TYPES[:4],
    "stc": ("debate-same-counter", "debate-oppo-counter", "theme-counter"),
    "sta": TYPES[:6],
    "epc": ("debate-same-counter", "debate-oppo-counter", "theme-counter", "portal-counter"),
    "epa": TYPES,
}
NOT_A_CANDIDATE = -1


def candidate_types(split: PairedSplit, pairs: np.ndarray | None = None) -> np.ndarray:
    """[P, 2Q] int8: the type index (into :data:`TYPES`) of every table row for every query of ``pairs`` (indices of
    pairs; default all), or -1.

    -1 marks the query itself, its true counter, and counters with the true counter's text.
    """
    t = split.table
    pairs = np.arange(split.n_pairs) if pairs is None else np.asarray(pairs)
    # integer codes: comparing [P, 2Q] ints is far cheaper than comparing strings
    theme, debate, stance = (pd.factorize(col)[0] for col in (t["theme"], t["theme"] + "/" + t["debate"], t["stance"]))
    q, c = split.query[pairs], split.counter[pairs]
    same_debate = debate[q][:, None] == debate[None, :]
    same_theme = theme[q][:, None] == theme[None, :]
    same_side = stance[q][:, None] == stance[None, :]
    counter = np.broadcast_to(split.is_counter[None, :], same_debate.shape)
    # index = 2 * scope + {counter: 0, point: 1}, with debate types ordered as in TYPES; int8 throughout, so a block's
    # temporaries are a byte a cell, not eight
    i8 = np.int8
    debate_type = np.select(
        [counter & same_side, counter & ~same_side, ~counter & ~same_side], [i8(0), i8(1), i8(2)], i8(3)
    )
    other_type = np.where(same_theme, i8(4), i8(6)) + ~counter
    types = np.where(same_debate, debate_type, other_type).astype(np.int8, copy=False)
    types[~split.is_candidate(np.broadcast_to(np.arange(len(t)), types.shape), pairs)] = NOT_A_CANDIDATE
    types[np.arange(len(q)), c] = NOT_A_CANDIDATE  # the true counter is scored, never a false candidate
    return types


def task_masks(types: np.ndarray) -> dict[str, np.ndarray]:
    """Task name → [P, 2Q] bool mask of its false candidates (``types``: :func:`candidate_types`)."""
    return {task: np.isin(types, [TYPES.index(name) for name in names]) for task, names in TASKS.items()}


class TaskPools:
    """The 8 tasks' pools block by block (:data:`biencoder.engine.retrieval.pools.PoolMasks`): called with a block of
    queries (indices of pairs [B]), task name → [B, 2Q] bool false candidates; ``candidates`` sums each task's false
    candidates over the blocks seen."""

    def __init__(self, split: PairedSplit):
        self.split, self.candidates = split, dict.fromkeys(TASKS, 0)

    def __call__(self, pairs: np.ndarray) -> dict[str, np.ndarray]:
        masks = task_masks(candidate_types(self.split, pairs))
        for task, mask in masks.items():
            self.candidates[task] += int(mask.sum())
        return masks


#: scores of a block of queries against every row: (indices of pairs [B]) -> [B, 2Q], higher = better
Scorer = Callable[[np.ndarray], np.ndarray]


def cosine_scorer(split: PairedSplit, pooled: torch.Tensor) -> Scorer:
    """Cosine of the pooled vectors [2Q, H] (float32) between each query of a block and every row.

    Rows with equal vectors (duplicate texts) get the score of the first of them: a BLAS rounds a float32 dot product
    by where its row and column sit in the matrix (blocks of 1-7 queries moved scores by up to 6e-7 and split equal
    columns), and a tie with the true counter must stay a tie, whatever the blocks."""
    pooled = pooled.float()
    rows = torch.nn.functional.normalize(pooled, dim=1)
    _, first, inverse = np.unique(pooled.numpy(), axis=0, return_index=True, return_inverse=True)
    same = None if len(first) == len(pooled) else torch.from_numpy(first[inverse.reshape(-1)])

    def scores(pairs: np.ndarray) -> np.ndarray:
        block = torch.nn.functional.normalize(pooled[split.query[pairs]], dim=1) @ rows.T
        return (block if same is None else block[:, same]).numpy()

    return scores


def tfidf_scorer(split: PairedSplit) -> Scorer:
    """TF-IDF cosine (float32) between each query of a block and every row; the vectoriser is fit on the split's
    texts once. The sparse product is row by row, so a block's scores are the rows of the whole matrix's."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    matrix = TfidfVectorizer(sublinear_tf=True).fit_transform(split.texts)  # rows are L2-normalised
    transposed = matrix.T.tocsr()  # what `@` would convert matrix.T (CSC) to, once instead of once a block
    return lambda pairs: (matrix[split.query[pairs]] @ transposed).toarray().astype(np.float32)


def tfidf_scores(split: PairedSplit, pairs: np.ndarray | None = None) -> np.ndarray:
    """[P, 2Q] TF-IDF cosine between each query of ``pairs`` (default all) and every row (:func:`tfidf_scorer`)."""
    return tfidf_scorer(split)(np.arange(split.n_pairs) if pairs is None else np.asarray(pairs))


#: the two baselines every trained cell is compared with: score name (as in :func:`evaluate_tasks`) -> label
BASELINES = {"encoder_cosine": "zero-shot", "tfidf": "TF-IDF"}


def block_ranks(
    split: PairedSplit,
    scorer: Scorer,
    pools: PoolMasks,
    pairs: np.ndarray | None = None,
    cells: int = BLOCK_CELLS,
    multiple: int = 1,
) -> dict[str, np.ndarray]:
    """Per pool, [P] the rank of each true counter of the queries ``pairs`` (default all) under ``scorer`` among its
    pool's false candidates (:func:`query_ranks`: ties count against), scored a block of queries at a time
    (:func:`biencoder.engine.retrieval.order.query_blocks` with ``cells`` and ``multiple``)."""
    pairs = np.arange(split.n_pairs) if pairs is None else np.asarray(pairs)
    parts: dict[str, list[np.ndarray]] = {}
    for block in query_blocks(len(pairs), len(split.table), cells, multiple):
        scores = scorer(pairs[block])
        for name, mask in pools(pairs[block]).items():
            parts.setdefault(name, []).append(query_ranks(scores, mask, split.counter[pairs[block]]))
    return {name: np.concatenate(p) for name, p in parts.items()}


def baseline_ranks(
    split: PairedSplit, pooled: torch.Tensor, pairs: np.ndarray | None = None, cells: int = BLOCK_CELLS
) -> dict[str, np.ndarray]:
    """Per query of ``pairs`` (indices of pairs; default all), the rank of its true counter in the per-epoch top-1's
    pool (:func:`~biencoder.engine.retrieval.rerank.pool_mask`; ArguAna's epa pool with ``data.pool=all``) under each
    of :data:`BASELINES`: ``{"encoder_cosine": [P], "tfidf": [P]}``, ranks from 1 (ties count against). Needs no theme,
    debate or stance: pair files get their baselines too.

    ``pooled``: [2Q, H] pooled vectors of the split's rows from the untrained encoder (zero-shot cosine); TF-IDF is
    fit on the split's texts. On ArguAna the mean of ``rank == 1`` is what ``evaluate_tasks(split, score)["epa"]``
    reports. Scored ``cells`` query × row cells at a time.
    """

    def pools(block: np.ndarray) -> dict[str, np.ndarray]:
        return {"pool": pool_mask(split, block)}

    return {
        name: block_ranks(split, scorer, pools, pairs, cells)["pool"]
        for name, scorer in (("encoder_cosine", cosine_scorer(split, pooled)), ("tfidf", tfidf_scorer(split)))
    }


def evaluate_tasks(
    split: PairedSplit,
    score: str,
    model: BiModel | None = None,
    emb: Embeddings | None = None,
    rerank: Rerank = SCHEMA_RERANK,
    groups: dict[str, np.ndarray] | None = None,
) -> dict[str, dict]:
    """Accuracy@1, MRR and pool sizes of the eight tasks on ``split``.

    Args:
        score: ``rerank`` (per task pool: k nearest in the ``rerank.space`` space, reordered by the classifier's
            logit margin, the rest after them by distance; :func:`biencoder.engine.retrieval.pools.pool_ranks`),
            ``classifier`` (logit margin for every candidate), ``sim`` (negative sim distance), ``encoder_cosine``
            (cosine of pooled embeddings), ``tfidf``.
        model, emb: the model and the :class:`Embeddings` of all 2Q rows (not needed for ``tfidf``;
            ``encoder_cosine`` needs only ``emb``).
        rerank: ``k``; ``space``, where ``rerank`` takes the k from: ``sim`` distance or ``encoder`` cosine (the rest
            of the pool follows in that order); the classifier's ``batch_size`` and ``device``; ``cells``, the
            query × row cells scored at once (:data:`~biencoder.engine.retrieval.order.BLOCK_CELLS`), which changes
            no number but the float32 cosine's rounding (a BLAS rounds a row's dot products by where it sits in the
            matrix).
        groups: optional ``{name: [Q] bool}`` query groups (e.g. unseen / seen test queries), reported apart.
    Returns:
        ``{task: {"accuracy_at_1", "mrr", "queries", "candidates"}}`` (:func:`~.metrics.task_metrics` of the ranks
        over the task's whole pool); candidates = false candidates summed over queries; with ``groups`` also
        ``"groups": {name: {"accuracy_at_1", "mrr", "queries"}}`` (None metrics for an empty group).
    """
    pools = TaskPools(split)
    if score == "rerank":
        ranks = pool_ranks(model, emb, split, pools, rerank)
    else:
        # the classifier scores B·2Q pairs a block: a multiple of batch_size keeps its batches those of one whole pass
        size = rerank.batch_size
        multiple = size // math.gcd(size, len(split.table)) if score == "classifier" else 1
        scorer = scorer_of(split, score, model, emb, rerank.device, size)
        ranks = block_ranks(split, scorer, pools, cells=rerank.cells, multiple=multiple)
    results = {}
    for task in TASKS:
        every = Ranks(ranks[task])
        results[task] = {**task_metrics(every), "queries": split.n_pairs, "candidates": pools.candidates[task]}
        if groups:
            results[task]["groups"] = {
                name: {**task_metrics(group), "queries": len(group)} for name, group in by_group(every, groups).items()
            }
    return results


def scorer_of(
    split: PairedSplit, score: str, model: BiModel | None, emb: Embeddings | None, device, batch_size: int
) -> Scorer:
    """The :data:`Scorer` of ``score`` (any of :func:`evaluate_tasks`'s but rerank)."""
    if score == "tfidf":
        return tfidf_scorer(split)
    if score == "encoder_cosine":
        return cosine_scorer(split, emb.pooled)
    if score == "sim":
        sim = emb.sim.double()  # distances() reads it as it is, once for every block
        return lambda pairs: -distances(sim, split.query[pairs])
    if score == "classifier":
        n = len(split.texts)

        def margins(pairs: np.ndarray) -> np.ndarray:
            every = np.broadcast_to(np.arange(n), (len(pairs), n))
            return shortlist_margins(model, emb, split.query[pairs], [every], batch_size, device)[0]

        return margins
    raise ValueError(f"unknown score '{score}'")


def pool_sizes(split: PairedSplit, cells: int = BLOCK_CELLS) -> dict[str, dict[str, int]]:
    """``{task: {"queries", "candidates"}}`` without scoring anything (a block of queries at a time)."""
    pools = TaskPools(split)
    for pairs in query_blocks(split.n_pairs, len(split.table), cells):
        pools(pairs)
    return {task: {"queries": split.n_pairs, "candidates": pools.candidates[task]} for task in TASKS}
