"""The eight official tasks of Wachsmuth, Syed & Stein (ACL 2018): sdoc, sdc, sdoa, sda, stc, sta, epc, epa.

Queries: every point that has a counter. True candidate: its counter. False candidates: arguments that belong
to pairs, never the query itself, never a counter whose text equals the true counter's text; typed relative
to the query (see :data:`TYPES`); each task is a union of types. Accuracy@1 counts a query when its true
counter scores strictly higher than every false candidate (ties count against it); MRR uses the same ranks.

Scores are computed for whole blocks of queries at once (never per pair, never a pairs × candidates × features
tensor): the memory held is a few [Q, 2Q] matrices (float64 distances, float32 scores). The ``rerank`` score is
:mod:`biencoder.engine.rerank`'s retrieve-then-rerank over each task's pool.

Command line: ``python -m biencoder.tasks <root> --split test [--json]`` prints pool sizes per task.
"""

from __future__ import annotations


import numpy as np
import pandas as pd
import torch

from .corpus import PairedSplit
from .model import BiModel, Embeddings
from .rerank import distances, pool_ranks, query_ranks, rank_summary, shortlist_margins

TYPES = ("debate-same-counter", "debate-oppo-counter", "debate-oppo-point", "debate-same-point",
         "theme-counter", "theme-point", "portal-counter", "portal-point")
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


def candidate_types(split: PairedSplit) -> np.ndarray:
    """[Q, 2Q] int8: the type index (into :data:`TYPES`) of every table row for every query, or -1.

    -1 marks the query itself, its true counter, and counters with the true counter's text.
    """
    t = split.table
    # integer codes: comparing [Q, 2Q] ints is far cheaper than comparing strings
    theme, debate, stance = (pd.factorize(col)[0] for col in (t["theme"], t["theme"] + "/" + t["debate"], t["stance"]))
    q, c = split.query, split.counter
    same_debate = debate[q][:, None] == debate[None, :]
    same_theme = theme[q][:, None] == theme[None, :]
    same_side = stance[q][:, None] == stance[None, :]
    counter = np.broadcast_to(split.is_counter[None, :], same_debate.shape)
    # index = 2 * scope + {counter: 0, point: 1}, with debate types ordered as in TYPES
    debate_type = np.select([counter & same_side, counter & ~same_side, ~counter & ~same_side], [0, 1, 2], 3)
    other_type = np.where(same_theme, 4, 6) + ~counter
    types = np.where(same_debate, debate_type, other_type).astype(np.int8)
    types[~split.is_candidate(np.broadcast_to(np.arange(len(t)), types.shape))] = NOT_A_CANDIDATE
    types[np.arange(len(q)), c] = NOT_A_CANDIDATE  # the true counter is scored, never a false candidate
    return types


def task_masks(types: np.ndarray) -> dict[str, np.ndarray]:
    """Task name → [Q, 2Q] bool mask of its false candidates."""
    return {task: np.isin(types, [TYPES.index(name) for name in names]) for task, names in TASKS.items()}


def _cosine(a: torch.Tensor, b: torch.Tensor) -> np.ndarray:
    a, b = torch.nn.functional.normalize(a.float(), dim=1), torch.nn.functional.normalize(b.float(), dim=1)
    return (a @ b.T).numpy()


def tfidf_scores(split: PairedSplit) -> np.ndarray:
    """[Q, 2Q] TF-IDF cosine between each query and every row; the vectoriser is fit on the split's texts."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    matrix = TfidfVectorizer(sublinear_tf=True).fit_transform(split.texts)  # rows are L2-normalised
    return (matrix[split.query] @ matrix.T).toarray().astype(np.float32)


#: the two baselines every trained cell is compared with: score name (as in :func:`evaluate_tasks`) -> label
BASELINES = {"encoder_cosine": "zero-shot", "tfidf": "TF-IDF"}


def pool_mask(split: PairedSplit) -> np.ndarray:
    """[Q, 2Q] bool: the false candidates of each query in the per-epoch top-1's pool (:meth:`PairedSplit.is_candidate`
    less the true counter); with ``data.pool=all`` on ArguAna, the epa task's."""
    mask = split.is_candidate(np.broadcast_to(np.arange(len(split.texts)), (split.n_pairs, len(split.texts))))
    mask[np.arange(split.n_pairs), split.counter] = False
    return mask


def baseline_ranks(split: PairedSplit, pooled: torch.Tensor) -> dict[str, np.ndarray]:
    """Per query, the rank of its true counter in the per-epoch top-1's pool (:func:`pool_mask`; ArguAna's epa pool
    with ``data.pool=all``) under each of :data:`BASELINES`: ``{"encoder_cosine": [Q], "tfidf": [Q]}``, ranks from 1
    (ties count against). Needs no theme, debate or stance: pair files get their baselines too.

    ``pooled``: [2Q, H] pooled vectors of the split's rows from the untrained encoder (zero-shot cosine); TF-IDF is
    fit on the split's texts. On ArguAna the mean of ``rank == 1`` is what ``evaluate_tasks(split, score)["epa"]``
    reports.
    """
    mask = pool_mask(split)
    scores = {"encoder_cosine": _cosine(pooled[split.query], pooled), "tfidf": tfidf_scores(split)}
    return {name: query_ranks(s, mask, split.counter) for name, s in scores.items()}


def evaluate_tasks(split: PairedSplit, score: str, model: BiModel | None = None, emb: Embeddings | None = None,
                   k: int = 10, device="cpu", batch_size: int = 4096,
                   groups: dict[str, np.ndarray] | None = None, retrieve: str = "sim") -> dict[str, dict]:
    """Accuracy@1, MRR and pool sizes of the eight tasks on ``split``.

    Args:
        score: ``rerank`` (per task pool: k nearest in the ``retrieve`` space, reordered by the classifier's logit
            margin, the rest after them by distance; :func:`biencoder.engine.rerank.pool_ranks`), ``classifier`` (logit
            margin for every candidate), ``sim`` (negative sim distance), ``encoder_cosine`` (cosine of pooled
            embeddings), ``tfidf``.
        model, emb: the model and the :class:`Embeddings` of all 2Q rows (not needed for ``tfidf``;
            ``encoder_cosine`` needs only ``emb``).
        retrieve: where ``rerank`` takes the k from: ``sim`` distance or ``encoder`` cosine (the rest of the pool
            follows in that order).
        groups: optional ``{name: [Q] bool}`` query groups (e.g. unseen / seen test queries), reported apart.
    Returns:
        ``{task: {"accuracy_at_1", "mrr", "queries", "candidates"}}``; candidates = false candidates summed
        over queries; with ``groups`` also ``"groups": {name: {"accuracy_at_1", "mrr", "queries"}}`` (None
        metrics for an empty group).
    """
    masks = task_masks(candidate_types(split))
    if score == "rerank":
        ranks = pool_ranks(model, emb, split, masks, k, retrieve, batch_size, device)
    else:
        scores = _scores(split, score, model, emb, device, batch_size)
        ranks = {task: query_ranks(scores, mask, split.counter) for task, mask in masks.items()}
    results = {}
    for task, mask in masks.items():
        results[task] = {**rank_summary(ranks[task]), "queries": split.n_pairs, "candidates": int(mask.sum())}
        if groups:
            results[task]["groups"] = {name: {**rank_summary(ranks[task][m]), "queries": int(m.sum())}
                                       for name, m in groups.items()}
    return results


def _scores(split: PairedSplit, score: str, model: BiModel | None, emb: Embeddings | None, device,
            batch_size: int) -> np.ndarray:
    """[Q, 2Q] score of every row for every query under ``score`` (any of :func:`evaluate_tasks`'s but rerank)."""
    if score == "tfidf":
        return tfidf_scores(split)
    if score == "encoder_cosine":
        return _cosine(emb.pooled[split.query], emb.pooled)
    if score == "sim":
        return -distances(emb.sim, split.query)
    if score == "classifier":
        every = np.broadcast_to(np.arange(len(split.texts)), (split.n_pairs, len(split.texts)))
        [margins] = shortlist_margins(model, emb, split.query, [every], batch_size, device)
        return margins
    raise ValueError(f"unknown score '{score}'")


def pool_sizes(split: PairedSplit) -> dict[str, dict[str, int]]:
    """``{task: {"queries", "candidates"}}`` without scoring anything."""
    masks = task_masks(candidate_types(split))
    return {task: {"queries": split.n_pairs, "candidates": int(mask.sum())} for task, mask in masks.items()}
