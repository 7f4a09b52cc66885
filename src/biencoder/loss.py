"""Triplet margin loss on sim embeddings + cross-entropy on the pair classifier.

Inputs: a :class:`~biencoder.model.BiModel` and the :class:`~biencoder.model.Embeddings` of a batch of
(point, counter, negative) triplets, each [B, ·]. Requirements: the negative is never the counter (the miner
guarantees it). Reference: Schroff et al. 2015 (FaceNet) for the triplet margin loss; the pair classifier is
trained on (point, counter) → 1 and (point, negative) → 0.

    total = triplet_weight · TripletMargin(s_p, s_c, s_n; margin, p=2)
          + ce_weight · (CE(logits(p, c), 1) + CE(logits(p, n), 0))
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .model import BiModel, Embeddings


@dataclass
class LossOutput:
    total: Tensor
    #: loss (the weighted total), triplet, ce_pos, ce_neg (unweighted): detached 0-d tensors on the loss's device, so
    #: that a step never waits for the device; the runner sums them there and reads them once an epoch
    parts: dict[str, Tensor]
    features: Tensor  # [2B, F] classifier input before LayerNorm/ReLU (positive pairs, then negative pairs)
    head_input: Tensor  # [2B, F] after them


class TripletCELoss(nn.Module):
    """Weighted sum of a triplet margin loss and the two cross-entropy terms (see module docstring)."""

    def __init__(self, margin: float = 1.0, triplet_weight: float = 1.0, ce_weight: float = 1.0):
        super().__init__()
        self.triplet = nn.TripletMarginLoss(margin=margin, p=2)
        self.triplet_weight = triplet_weight
        self.ce_weight = ce_weight
        self._labels: dict[tuple[int, torch.device], Tensor] = {}  # [2B] (1s then 0s) per batch size and device

    def forward(self, model: BiModel, point: Embeddings, counter: Embeddings, negative: Embeddings) -> LossOutput:
        batch = point.sim.shape[0]
        triplet = self.triplet(point.sim, counter.sim, negative.sim)
        # positives and negatives go through the head in one call so its statistics see both
        features = model.pair_features(
            Embeddings(torch.cat([point.sim, point.sim]), torch.cat([point.pooled, point.pooled])),
            Embeddings(torch.cat([counter.sim, negative.sim]), torch.cat([counter.pooled, negative.pooled])),
        )
        head_input, logits = model.head(features)
        key = (batch, logits.device)
        if key not in self._labels:  # made once, not every step (five small ops and a host-to-device copy)
            self._labels[key] = torch.cat([torch.ones(batch), torch.zeros(batch)]).long().to(logits.device)
        labels = self._labels[key]
        ce = F.cross_entropy(logits.float(), labels, reduction="none")
        ce_pos, ce_neg = ce[:batch].mean(), ce[batch:].mean()
        total = self.triplet_weight * triplet + self.ce_weight * (ce_pos + ce_neg)
        parts = {"loss": total.detach(), "triplet": triplet.detach(), "ce_pos": ce_pos.detach(), "ce_neg": ce_neg.detach()}
        return LossOutput(total, parts, features, head_input)
