"""The training losses, chosen with ``loss=triplet_ce`` (the default) or ``loss=infonce`` (``loss.name``).

Both take a :class:`~biencoder.engine.modeling.model.BiModel` and the
:class:`~biencoder.engine.modeling.model.Embeddings` of a batch of (point, counter, negative) triplets, each [B, ·],
where the negative is the one mined for that pair (:mod:`biencoder.engine.retrieval.negatives`: never the point's or
the counter's text). Both add the pair classifier's cross-entropy on (point, counter) → 1 and (point, negative) → 0
with its own weight ``ce_weight``; they differ in what trains the sim head, the space that retrieves the k candidates
the classifier reranks.

- :class:`TripletCELoss` (``triplet_ce``): one negative per query, a margin on Euclidean distances.
- :class:`InfoNCELoss` (``infonce``): every other counter in the batch and every mined negative in the batch are
  the query's negatives, in one softmax over cosine similarities (sentence-transformers'
  MultipleNegativesRankingLoss with hard negatives).

"The same text" is :attr:`biencoder.engine.data.paired.PairedSplit.text_id` equality: the identity the evaluation
uses for its "duplicates of the true counter are that counter" rule.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn import functional as F

from ..config.schema import InfoNCELossSchema, TripletCELossSchema, loss_keys
from .model import BiModel, Embeddings


@dataclass
class LossOutput:
    total: Tensor
    #: loss (the weighted total), triplet, ce_pos, ce_neg (unweighted): detached 0-d tensors on the loss's device, so
    #: that a step never waits for the device; the runner sums them there and reads them once an epoch
    parts: dict[str, Tensor]
    #: [2B, W] what the head's output layer reads before its norm and activation (positive pairs, then negative
    #: pairs; the pair features when the head has no hidden layer), and [2B, W] after them: the head statistics'
    #: ``pre`` and ``post`` (:meth:`~biencoder.engine.modeling.head.PairHead.forward`)
    head_pre: Tensor
    head_post: Tensor


def _pair_cross_entropy(model: BiModel, point: Embeddings, counter: Embeddings, negative: Embeddings):
    """The pair classifier's two cross-entropy terms: (point, counter) → 1 and (point, negative) → 0.

    Returns (ce_pos, ce_neg) as 0-d tensors (means over the B pairs), and the head's ``pre`` and ``post`` [2B, W]
    (positive pairs first) for the head statistics.
    """
    batch = point.sim.shape[0]
    # positives and negatives go through the head in one call so its statistics (and a BatchNorm's) see both
    pre, post, logits = model.head.pair_outputs(
        Embeddings(torch.cat([point.sim, point.sim]), torch.cat([point.pooled, point.pooled])),
        Embeddings(torch.cat([counter.sim, negative.sim]), torch.cat([counter.pooled, negative.pooled])),
    )
    ce = F.cross_entropy(logits.float(), _pair_labels(batch, logits.device), reduction="none")
    return ce[:batch].mean(), ce[batch:].mean(), pre, post


@functools.lru_cache(maxsize=16)
def _pair_labels(batch: int, device: torch.device) -> Tensor:
    """[2B] int64: 1 for the B (point, counter) pairs, then 0 for the B (point, negative) pairs. Made once per batch
    size and device, not every step (five small ops and a host-to-device copy)."""
    return torch.cat([torch.ones(batch), torch.zeros(batch)]).long().to(device)


def _parts(names: tuple[str, ...], values: list[Tensor]) -> dict[str, Tensor]:
    # detached, left on the device: reading them here would stall every step; the runner reads them once an epoch
    return {name: value.detach() for name, value in zip(names, values, strict=True)}


class TripletCELoss(nn.Module):
    """Triplet margin loss on the sim embeddings + the pair classifier's cross-entropy (``loss=triplet_ce``).

    Inputs: the embeddings of (point, counter, negative) triplets, [B, ·] each.
    Negatives: the one mined negative of each pair; no other example in the batch takes part.
    Requirements: the negative never has the point's or the counter's text (the miner guarantees it); any batch
    size works, and duplicate texts elsewhere in the batch do not matter.
    Reference: Schroff et al. 2015 (FaceNet) for the triplet margin loss.

        total = triplet_weight · TripletMargin(s_p, s_c, s_n; margin, p=2)
              + ce_weight · (CE(logits(p, c), 1) + CE(logits(p, n), 0))

    Parts logged: loss, triplet, ce_pos, ce_neg.
    """

    def __init__(
        self,
        margin: float = TripletCELossSchema.margin,
        triplet_weight: float = TripletCELossSchema.triplet_weight,
        ce_weight: float = TripletCELossSchema.ce_weight,
    ):
        super().__init__()
        self.triplet = nn.TripletMarginLoss(margin=margin, p=2)
        self.triplet_weight = triplet_weight
        self.ce_weight = ce_weight

    def forward(
        self,
        model: BiModel,
        point: Embeddings,
        counter: Embeddings,
        negative: Embeddings,
        text_id: Tensor | None = None,
    ) -> LossOutput:
        """``text_id`` ([3, B], ignored here): the triplet loss compares each query with its own two rows only."""
        triplet = self.triplet(point.sim, counter.sim, negative.sim)
        ce_pos, ce_neg, pre, post = _pair_cross_entropy(model, point, counter, negative)
        total = self.triplet_weight * triplet + self.ce_weight * (ce_pos + ce_neg)
        parts = _parts(("loss", "triplet", "ce_pos", "ce_neg"), [total, triplet, ce_pos, ce_neg])
        return LossOutput(total, parts, pre, post)


def _group() -> bool:
    # an initialised process group, even of one process (the test of the shared negatives runs one)
    return dist.is_available() and dist.is_initialized()


class _GatherWithGrad(torch.autograd.Function):
    """All-gather whose backward sends each rank the gradient of every rank's loss with respect to its own rows (the
    sum over ranks), with the public collectives only (torch's ``distributed.nn`` version is deprecated)."""

    @staticmethod
    def forward(ctx, tensor: Tensor) -> Tensor:
        out = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
        dist.all_gather(out, tensor.contiguous())
        return torch.cat(out)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad)  # every rank's loss saw every rank's rows
        return grad.chunk(dist.get_world_size())[dist.get_rank()]


def gather_with_grad(tensor: Tensor) -> Tensor:
    """[N, ·] on every process → [world·N, ·] in rank order, differentiable (each rank's gradient flows back to
    the rank that made the rows). Without an initialised process group: ``tensor`` itself."""
    if not _group():
        return tensor
    return _GatherWithGrad.apply(tensor)


def _gather_ids(ids: Tensor) -> Tensor:
    """[N] ints on every process → [world·N] in rank order (no gradient)."""
    if not _group():
        return ids
    out = [torch.empty_like(ids) for _ in range(dist.get_world_size())]
    dist.all_gather(out, ids)
    return torch.cat(out)


def same_text_mask(query_text: Tensor, positive_text: Tensor, candidate_text: Tensor, target: Tensor) -> Tensor:
    """[B, C] bool: candidate j must not count as a negative of query i.

    True where the candidate's text equals the query's positive (a duplicate of its true counter) or the query
    itself, except at the target column (the positive itself stays). Inputs: text ids [B], [B], [C]; target [B].
    """
    same = (candidate_text[None, :] == positive_text[:, None]) | (candidate_text[None, :] == query_text[:, None])
    same[torch.arange(len(target), device=target.device), target] = False
    return same


def full_precision(device: torch.device):
    """A context in which ``device``'s autocast is off, so float32 inputs give float32 results.

    ``.float()`` on a matmul's inputs is not enough under ``torch.autocast``: autocast casts them back to bf16 for
    the matmul, and InfoNCE's scores are cosines times ``scale`` (20), where bf16's 8-bit mantissa is off by a few
    hundredths, the loss by ~1e-3 relative and its gradients by ~1e-2.
    """
    return torch.autocast(device_type=device.type, enabled=False)


class InfoNCELoss(nn.Module):
    """In-batch negatives plus mined negatives on the sim head + the pair classifier's cross-entropy
    (``loss=infonce``).

    Inputs: the embeddings of (point, counter, negative) triplets, [B, ·] each, and their text ids [3, B]
    (``PairedSplit.text_id`` of each row).
    Negatives: for query i, every counter of the batch except its own, and every mined negative of the batch
    (its own and the other queries'): 2B − 1 negatives, one softmax. With ``gather=True`` under DDP the
    candidates of every process join (2·B·world − 1 negatives). A candidate whose text equals the query's
    counter (a duplicate text: the corpus has them) or the query's own text is masked, never a negative.
    Requirements: the batch is the only source of negatives, so a larger batch gives more of them (batch 1 leaves
    just the mined negative). Every process must have the same batch size when ``gather`` is on.
    Reference: Henderson et al. 2017 (Efficient Natural Language Response Suggestion for Smart Reply: in-batch
    negatives); van den Oord et al. 2018 (Representation Learning with Contrastive Predictive Coding: InfoNCE);
    sentence-transformers' MultipleNegativesRankingLoss (its scale 20 = temperature 0.05 is the default here).

        scores[i, j] = scale · cos(s_p[i], cand[j]),  cand = [s_c (all B, or all ranks'), s_n (likewise)]
        total = CE(scores[i], target = own counter) averaged over i
              + ce_weight · (CE(logits(p, c), 1) + CE(logits(p, n), 0))

    ``ce_weight=0`` is InfoNCE alone (the classifier then gets no training signal: read ``retrieval_top1``, and
    use ``eval.score=sim`` for the 8 tasks).
    Precision: the scores and their softmax are float32 under any autocast (:func:`full_precision`); the encoder
    and the heads that make the vectors follow ``trainer.precision``.
    Parts logged: loss, infonce, ce_pos, ce_neg, masked (candidates masked per query, a mean).
    """

    def __init__(
        self,
        scale: float = InfoNCELossSchema.scale,
        ce_weight: float = InfoNCELossSchema.ce_weight,
        gather: bool = InfoNCELossSchema.gather,
    ):
        super().__init__()
        self.scale, self.ce_weight, self.gather = scale, ce_weight, gather

    def scores(
        self, point: Tensor, counter: Tensor, negative: Tensor, text_id: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """(scores [B, C], target [B], masked [B, C]) from sim vectors [B, D] and text ids [3, B]; C = 2B, or
        2·B·world with ``gather`` under DDP. Masked entries are −inf in ``scores``. ``scores`` is float32 whatever
        the autocast state (see :func:`full_precision`)."""
        with full_precision(point.device):
            return self._scores(point, counter, negative, text_id)

    def _scores(
        self, point: Tensor, counter: Tensor, negative: Tensor, text_id: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        batch = point.shape[0]
        query_text, positive_text, negative_text = text_id
        counters, negatives = counter, negative
        offset = 0
        if self.gather:
            counters, negatives = gather_with_grad(counter), gather_with_grad(negative)
            positive_all, negative_all = _gather_ids(positive_text), _gather_ids(negative_text)
            offset = (dist.get_rank() if _group() else 0) * batch
        else:
            positive_all, negative_all = positive_text, negative_text
        candidates = F.normalize(torch.cat([counters, negatives]).float(), dim=-1)
        candidate_text = torch.cat([positive_all, negative_all])
        target = torch.arange(batch, device=point.device) + offset
        scores = self.scale * F.normalize(point.float(), dim=-1) @ candidates.T
        masked = same_text_mask(query_text, positive_text, candidate_text, target)
        return scores.masked_fill(masked, float("-inf")), target, masked

    def forward(
        self,
        model: BiModel,
        point: Embeddings,
        counter: Embeddings,
        negative: Embeddings,
        text_id: Tensor | None = None,
    ) -> LossOutput:
        if text_id is None:
            raise ValueError("InfoNCELoss needs the text ids of the batch (duplicate texts must be masked)")
        with full_precision(point.sim.device):  # the softmax too: its log-sum-exp over 2B scores of range ±scale
            scores, target, masked = self._scores(point.sim, counter.sim, negative.sim, text_id)
            infonce = F.cross_entropy(scores, target)
        ce_pos, ce_neg, pre, post = _pair_cross_entropy(model, point, counter, negative)
        total = infonce + self.ce_weight * (ce_pos + ce_neg)
        parts = _parts(
            ("loss", "infonce", "ce_pos", "ce_neg", "masked"),
            [total, infonce, ce_pos, ce_neg, masked.sum(1).float().mean()],
        )
        return LossOutput(total, parts, pre, post)


#: ``loss.name`` → the loss (its keys and defaults: :data:`biencoder.engine.config.schema.LOSS_OPTIONS`)
LOSSES = {"triplet_ce": TripletCELoss, "infonce": InfoNCELoss}


def build_loss(loss_cfg) -> nn.Module:
    """The loss named by ``loss_cfg.name`` (see :data:`LOSSES`), built from the ``loss.*`` keys it reads."""
    return LOSSES[loss_cfg.name](**{key: loss_cfg[key] for key in loss_keys(loss_cfg.name)})
