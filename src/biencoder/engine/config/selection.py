"""The rule that picks a run's best epoch (:func:`selection`), as ``final.json`` records it, and how summaries name
it: one definition that the runner, the evaluation, the apps and the reports read."""

from __future__ import annotations

#: how people read the per-epoch metrics that can select a best epoch (final.json's ``selection.metric``)
METRIC_LABELS = {
    "top1": "top-1 (reranked)",
    "retrieval_top1": "retrieval top-1",
    "mrr": "MRR (reranked)",
    "ndcg_at_10": "nDCG@10",
    "mrr_at_10": "MRR@10",
    "recall_at_100": "recall@100",
}
#: what selected the best epoch of a finished run whose final.json has no ``selection`` (written before it existed)
SELECTION_BEFORE_RECORD = {"split": "val", "metric": "top1"}


def selection(ce_weight: float, metric: str | None, layout: str) -> dict[str, str]:
    """The metric that picks a run's best epoch, as ``final.json`` records it (``"selection"``):
    ``{"split": "val", "metric": m}``. ``m`` is ``metric`` (``eval.select``) when one is given, else the metric the
    run's numbers come from: the reranked ``top1`` when the pair classifier trains (``loss.ce_weight`` > 0), else
    ``retrieval_top1`` (the nearest neighbour is the true counter): with ``ce_weight=0`` the classifier gets no
    training signal, so its reranking is noise. A BEIR folder (``layout``, ``data.layout``, is ``beir``) is compared
    by nDCG@10 in its field, so there the classifier's runs pick by the val ``ndcg_at_10`` of the final ranking. The
    best epoch decides ``best.pt``, ``final.json``'s ``best``, the 8 tasks, ``test_hits.npy`` (the per-query top-1
    outcome on test of the ranking ``m`` reads: the retrieval order for ``retrieval_top1``, else the reranked one)
    and ``test.run.gz``, so every table built on a run reads this one rule."""
    if metric is not None:
        return {"split": "val", "metric": str(metric)}
    if ce_weight <= 0:
        return {"split": "val", "metric": "retrieval_top1"}
    return {"split": "val", "metric": "ndcg_at_10" if layout == "beir" else "top1"}


def selection_label(chosen: dict) -> str:
    """How summaries name a :func:`selection`: ``val retrieval top-1``, ``val top-1 (reranked)``."""
    return f"{chosen['split']} {METRIC_LABELS.get(chosen['metric'], chosen['metric'])}"


def untrained_classifier_note(score: str) -> str:
    """The one line a run with ``loss.ce_weight=0`` prints at its start and in its summary (such a run is allowed:
    InfoNCE alone is a retrieval model; what it must not do is report the untrained classifier's reranking as its
    result). ``score``: its ``eval.score``, named when the 8 tasks rerank with that classifier."""
    tasks = (
        f"; eval.score={score} scores the 8 tasks with that classifier too: add eval.score=sim"
        if score in ("rerank", "classifier")
        else ""
    )
    return (
        "loss.ce_weight=0: the pair classifier is not trained, so the reranked top1 and mrr are noise; the best "
        f"epoch is chosen by val retrieval_top1, this run's result{tasks}"
    )
