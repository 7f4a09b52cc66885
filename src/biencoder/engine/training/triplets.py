"""What a training step consumes: the training split with what its triplets are gathered from
(:class:`TrainingInputs`), this epoch's rows of (point, counter, negative) (:func:`triplet_rows`), a trained encoder's
padded token batches (:class:`TripletCollate`) and the whole training forward as one module (:class:`TripletStep`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ..data.corpus import PairedSplit
from ..modeling.encoding import TokenizedTexts
from ..modeling.loss import LossOutput
from ..modeling.model import BiModel
from ..retrieval.negatives import MinedNegatives


@dataclass(frozen=True)
class TrainingInputs:
    """The training ``split`` and what its triplets are gathered from: ``pooled``, a frozen encoder's pooled vectors
    [2Q + E, hidden] on the device, else ``tokens``, the trained encoder's token ids; each the table's rows, then
    the split's given negatives' (:attr:`PairedSplit.extra_texts`, E = 0 without)."""

    split: PairedSplit
    pooled: torch.Tensor | None = None
    tokens: TokenizedTexts | None = None


class TripletCollate:
    """Rows [B, 3] of (point, counter, negative) → one padded encoder batch of 3B texts, plus the rows.

    Without ``tokens`` (frozen encoder: the pooled vectors are cached) the batch holds the rows only. ``width``: the
    padded width of a batch whose longest text has n tokens (None: n itself), so that batches take a few static
    shapes (:func:`~biencoder.engine.training.step_graph.bucket_width`).
    """

    def __init__(self, tokens: TokenizedTexts | None, width: Callable[[int], int] | None = None):
        self.tokens, self.width = tokens, width

    def __call__(self, rows: list[np.ndarray]) -> dict[str, torch.Tensor]:
        rows = np.stack(rows)
        texts = rows.T.ravel()  # all points, then all counters, then all negatives
        width = None
        if self.tokens is not None and self.width is not None:
            width = self.width(int(self.tokens.lengths[texts].max()))
        batch = self.tokens.batch(texts, width) if self.tokens is not None else {}
        batch["rows"] = torch.from_numpy(rows)
        return batch


def triplet_rows(split: PairedSplit, negatives: MinedNegatives) -> np.ndarray:
    """[R + G, 3] training rows (point, counter, negative) for this epoch: one per relevant pair
    (:attr:`PairedSplit.relevant_pairs`: each pair's point and counter, R = Q; a BEIR query and each document relevant
    to it) with its query's freshly mined negative, then one per given negative of pair files
    (:attr:`PairedSplit.given_triplets`, rows ``2Q + j``; G = 0 without)."""
    pair, row, _ = split.relevant_pairs
    mined = np.stack([split.query[pair], row, negatives.row[pair]], axis=1)
    given = split.given_triplets
    return np.concatenate([mined, given]) if len(given) else mined


class TripletStep(nn.Module):
    """The whole training forward (triplet batch → :class:`LossOutput`) as one module, so DDP wraps all of it.

    Takes token ids (encoder trained) or the cached pooled vectors [3B, hidden] (encoder frozen), ordered
    points, counters, negatives, and their text ids [3B] in the same order (``PairedSplit.text_id``: the loss
    masks duplicate texts with them).
    """

    def __init__(self, model: BiModel, loss_fn: nn.Module):
        super().__init__()
        self.model, self.loss_fn = model, loss_fn

    def forward(
        self,
        pooled: torch.Tensor | None = None,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        text_id: torch.Tensor | None = None,
        padded: bool | None = None,
    ) -> LossOutput:
        emb = (
            self.model.from_pooled(pooled)
            if pooled is not None
            else self.model.embed(input_ids, attention_mask, padded)
        )
        point, counter, negative = emb.chunk(3)
        return self.loss_fn(self.model, point, counter, negative, None if text_id is None else text_id.view(3, -1))
