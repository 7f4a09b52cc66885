"""A run's best epoch so far (:class:`BestEpoch`): what the runner keeps of it, what ``last.pt`` saves of it
(:meth:`BestEpoch.saved`, :meth:`BestEpoch.from_saved`) and how a resumed run values it (:meth:`BestEpoch.valued_by`).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace

import numpy as np

log = logging.getLogger("biencoder")


@dataclass(frozen=True)
class BestEpoch:
    """The first epoch with the highest val value of the run's selection metric, so far.

    Attributes:
        metric: the selection metric (``final.json``'s ``selection``: ``top1``, or ``retrieval_top1``).
        epoch: that epoch (-1 before any was evaluated); ``value``: its val value of ``metric`` (-inf before).
        metrics: per split, that epoch's metrics (None before).
        state: the model's weights at that epoch, on the CPU (None before).
        hits: per test query, hit or miss at that epoch (``test_hits.npy``; None before).
        embs: the val and test embeddings of that epoch, kept in memory for the 8 tasks at the end (never saved: a
            resumed run computes them again).
    """

    metric: str
    epoch: int = -1
    value: float = -math.inf
    metrics: dict | None = None
    state: dict | None = None
    hits: np.ndarray | None = None
    embs: dict = field(default_factory=dict)

    def improved_by(self, val_metrics: dict) -> bool:
        """Whether an epoch whose val metrics are ``val_metrics`` is better: strictly higher (the first stays)."""
        return val_metrics[self.metric] > self.value

    def saved(self) -> dict:
        """What ``last.pt`` holds of it (``state`` and ``hits`` as they are; the caller converts them):
        every field but ``embs``."""
        return {
            "epoch": self.epoch,
            "metric": self.metric,
            "value": self.value,
            "metrics": self.metrics,
            "state": self.state,
            "hits": self.hits,
        }

    @classmethod
    def from_saved(cls, saved: dict) -> BestEpoch:
        """:meth:`saved`'s dict back; one written before the selection metric was recorded holds ``val_top1`` (it
        selected by the reranked top-1)."""
        if "metric" not in saved:
            metric, value = "top1", saved.get("val_top1", -math.inf)
        else:
            metric, value = saved["metric"], saved["value"]
        return cls(
            metric,
            saved["epoch"],
            value,
            saved.get("metrics"),
            saved.get("state"),
            saved.get("hits"),
        )

    def valued_by(self, metric: str, where: str) -> BestEpoch:
        """This best as a run that selects by val ``metric`` sees it: the same when that is its metric; else kept, and
        valued by its val ``metric`` (the earlier epochs' weights are gone, so they cannot be compared again), with
        one log line naming ``where`` it came from."""
        if self.metric == metric:
            return self
        log.warning(
            "%s: the epochs before the resume were selected by val %s, this run selects by val %s: the best so far "
            "(epoch %d) is kept and compared by its val %s",
            where,
            self.metric,
            metric,
            self.epoch,
            metric,
        )
        value = self.metrics["val"][metric] if self.metrics else -math.inf
        return replace(self, metric=metric, value=value)
