"""The pair head: the classifier over the fused features of two texts, built from a
:class:`~biencoder.engine.config.heads.HeadSpec` (docs/heads.md), and the statistics of what its output layer reads.

In front of the output layer ``Linear(width, 2)`` sit, in this order, the norm, the activation and dropout (each only
when set): with no hidden layer that is the card's head, features → LayerNorm? → ReLU? → ``Linear(F, 2)``. Each hidden
layer (``model.head.hidden``) is a linear layer followed by the norm, the activation and dropout, the usual MLP:
features → ``Linear(F, h1)`` → norm → activation → dropout → ... → ``Linear(h_last, 2)``. :class:`PairHead` is the one
definition, held by :class:`~biencoder.engine.modeling.model.BiModel` as ``model.head`` and loaded alone by
:func:`biencoder.engine.inference.export.load_pair_classifier`.

The first hidden layer reads the pair features as they are, [a, b, |a − b|] per embedding, so its output is a term
of a, a term of b and a term of |a − b|. Scoring many pairs of one table (:meth:`PairHead.pair_scorer`: every
evaluation) computes the terms of a text once per text, not once per pair: the same values as the layer over the
concatenated features, up to float rounding.

Built-in components are torch's modules with their defaults (``LayerNorm``, ``RMSNorm``, ``BatchNorm1d``; ``ReLU``,
``GELU``, ``Tanh``, ``SiLU``); a user's component is the module its factory returns when called with the width.
BatchNorm normalises by the batch in training (each process's own batch under DDP) and by its running statistics in
eval mode, which every evaluation uses.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Protocol

import torch
from torch import Tensor, nn

from ...errors import ConfigError
from ..config.heads import HeadSpec, component_factory

#: the embeddings each ``model.fusion`` puts in the pair features, in order; each adds [a, b, |a − b|] of it
FUSION_PARTS = {"concat": ("sim", "pooled"), "sim": ("sim",), "cls": ("pooled",)}
#: the built-in norms (called with the width) and activations (called with nothing) by config name
NORM_MODULES = {"layernorm": nn.LayerNorm, "rmsnorm": nn.RMSNorm, "batchnorm": nn.BatchNorm1d}
ACTIVATION_MODULES = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh, "silu": nn.SiLU}


class PairEmbeddings(Protocol):
    """What the head reads of a text's embeddings (:class:`~biencoder.engine.modeling.model.Embeddings`)."""

    sim: Tensor  # [N, sim_dim]
    pooled: Tensor  # [N, encoder width]


def component(key: str, value: str, width: int) -> nn.Module | None:
    """The module ``model.head.<key>`` = ``value`` names for inputs [B, ``width``] (None for ``none``): a built-in, or
    what a user's factory (an import path) returns when called with ``width``. Raises :class:`ConfigError` in one line
    for a factory that cannot be imported or does not return a module."""
    if value == "none":
        return None
    builtins = NORM_MODULES if key == "norm" else ACTIVATION_MODULES
    if value in builtins:
        return builtins[value](width) if key == "norm" else builtins[value]()
    made = component_factory(f"model.head.{key}", value)(width)
    if not isinstance(made, nn.Module):
        raise ConfigError(
            f"model.head.{key}={value!r} returned a {type(made).__name__}, not a torch.nn.Module: make the factory "
            "return a module that maps [B, width] to [B, width] (docs/heads.md)"
        )
    return made


class _Inputs(nn.Module):
    """What comes in front of a linear layer: the norm, the activation and dropout, each registered only when set
    (so a head without them has no module to call and no state-dict key for them)."""

    def _make_inputs(self, spec: HeadSpec, width: int) -> None:
        self.norm = component("norm", spec.norm, width)
        self.act = component("activation", spec.activation, width)
        self.drop = nn.Dropout(spec.dropout) if spec.dropout else None

    def _normed(self, x: Tensor) -> Tensor:
        if self.norm is not None:
            x = self.norm(x)
        return x if self.act is None else self.act(x)


class HiddenLayer(_Inputs):
    """One hidden layer: ``Linear(width_in, width_out)`` over the norm → activation → dropout of its input, which
    belong to the hidden layer before it (the first reads the pair features as they are: ``first``)."""

    def __init__(self, spec: HeadSpec, width_in: int, width_out: int, first: bool):
        super().__init__()
        if first:
            self.norm = self.act = self.drop = None
        else:
            self._make_inputs(spec, width_in)
        self.linear = nn.Linear(width_in, width_out)

    def forward(self, x: Tensor) -> Tensor:
        x = self._normed(x)
        return self.linear(x if self.drop is None else self.drop(x))


class PairHead(_Inputs):
    """The pair classifier: the fused features of (a, b) [B, F] → the hidden layers, each ``Linear`` → norm →
    activation → dropout → ... → ``Linear(width, 2)`` (class 1: b counters a); with no hidden layer, the features →
    norm → activation → dropout → ``Linear(F, 2)``.

    Args:
        fusion: which embeddings make the features (:data:`FUSION_PARTS`).
        sim_dim, encoder_width: the widths of the sim and pooled embeddings.
        spec: the head (:func:`~biencoder.engine.config.heads.head_spec` of a ``model.head`` config).

    State-dict keys: ``hidden.0.linear.*``, then ``hidden.<i>.{norm,act}.*`` (what follows hidden layer i − 1) and
    ``hidden.<i>.linear.*`` for each further hidden layer, then ``norm.*`` (what follows the last hidden layer, or
    normalises the features) and ``out.*``: the keys of the card's head are those it always had.
    """

    def __init__(self, fusion: str, sim_dim: int, encoder_width: int, spec: HeadSpec):
        super().__init__()
        self.fusion, self.spec = fusion, spec
        self._part_widths = tuple({"sim": sim_dim, "pooled": encoder_width}[part] for part in FUSION_PARTS[fusion])
        self.n_features = sum(3 * {"sim": sim_dim, "pooled": encoder_width}[part] for part in FUSION_PARTS[fusion])
        widths = [self.n_features, *spec.hidden]
        # before the output layer: the hidden layers' weights are drawn first, then the output layer's
        self.hidden = nn.ModuleList(HiddenLayer(spec, a, b, i == 0) for i, (a, b) in enumerate(pairwise(widths)))
        self._make_inputs(spec, widths[-1])
        self.out = nn.Linear(widths[-1], 2)

    def pair_features(self, a: PairEmbeddings, b: PairEmbeddings) -> Tensor:
        """Fused features [B, n_features] of the pairs (a[i], b[i])."""
        parts = []
        for part in FUSION_PARTS[self.fusion]:
            x, y = getattr(a, part), getattr(b, part)
            parts += [x, y, (x - y).abs()]
        return torch.cat(parts, dim=-1)

    def gather_pair_features(self, emb: PairEmbeddings, rows_a: Tensor, rows_b: Tensor, out: Tensor) -> Tensor:
        """:meth:`pair_features` of (emb[rows_a[i]], emb[rows_b[i]]) written into ``out`` [≥ B, n_features] (no
        autograd; ``out`` of the embeddings' dtype): the rows are gathered straight into their places, with no
        intermediate tensors; the same values. Returns ``out[:B]``; raises ValueError when ``out`` cannot hold them."""
        if out.shape[0] < len(rows_a) or out.shape[1] != self.n_features:
            raise ValueError(
                f"a buffer of {tuple(out.shape)} cannot hold the features of {len(rows_a)} pairs "
                f"({self.n_features} each)"
            )
        out, start = out[: len(rows_a)], 0
        for part in FUSION_PARTS[self.fusion]:
            table = getattr(emb, part)
            x, y, diff = out[:, start : start + 3 * table.shape[1]].chunk(3, dim=1)
            torch.index_select(table, 0, rows_a, out=x)
            torch.index_select(table, 0, rows_b, out=y)
            torch.sub(x, y, out=diff).abs_()
            start += 3 * table.shape[1]
        return out

    def forward(self, features: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Features [B, F] → (``pre`` [B, W], ``post`` [B, W], logits [B, 2]). ``pre`` is what the output layer's norm
        reads (the last hidden layer's output; the features themselves without hidden layers), ``post`` the same after
        the norm and the activation, before dropout: the tensors of the head statistics
        (:func:`head_statistics_vector`)."""
        pre = features
        for layer in self.hidden:
            pre = layer(pre)
        post = self._normed(pre)
        return pre, post, self.out(post if self.drop is None else self.drop(post))

    def pair_outputs(self, a: PairEmbeddings, b: PairEmbeddings) -> tuple[Tensor, Tensor, Tensor]:
        """:meth:`forward` of :meth:`pair_features` of the pairs (a[i], b[i]): (``pre``, ``post``, logits)."""
        return self(self.pair_features(a, b))

    def classify_pair(self, point: PairEmbeddings, candidate: PairEmbeddings) -> Tensor:
        """Logits [B, 2] for (point[i], candidate[i]); class 1 = the candidate counters the point."""
        return self.pair_outputs(point, candidate)[2]

    def pair_scorer(self, emb: PairEmbeddings, batch_size: int):
        """A function (rows_a, rows_b) → logits [P, 2] of the pairs (emb[rows_a[i]], emb[rows_b[i]]), P at most
        ``batch_size``, for scoring many pairs of one table without autograd. Without hidden layers it gathers each
        block's features into one buffer (:meth:`gather_pair_features`) and runs :meth:`forward`; with them the first
        layer's text terms are computed once for every row of ``emb`` and gathered per pair, beside the pair's
        difference terms."""
        if not self.hidden:
            first_part = getattr(emb, self._parts[0])
            buffer = torch.empty(batch_size, self.n_features, dtype=first_part.dtype, device=first_part.device)
            return lambda rows_a, rows_b: self(self.gather_pair_features(emb, rows_a, rows_b, buffer))[2]
        terms_a = self._text_terms(emb, 0) + self.hidden[0].linear.bias
        terms_b = self._text_terms(emb, 1)

        def score(rows_a: Tensor, rows_b: Tensor) -> Tensor:
            tables = [getattr(emb, part) for part in self._parts]
            pairs = [(table.index_select(0, rows_a), table.index_select(0, rows_b)) for table in tables]
            first = terms_a.index_select(0, rows_a) + terms_b.index_select(0, rows_b)
            return self._after_first(first + self._difference_terms(pairs))[2]

        return score

    @property
    def _parts(self) -> tuple[str, ...]:
        return FUSION_PARTS[self.fusion]

    def _first_weights(self, side: int) -> list[Tensor]:
        """The first hidden layer's weight columns that read side ``side`` of each part (0: a, 1: b, 2: |a − b|)."""
        weight, start, out = self.hidden[0].linear.weight, 0, []
        for width in self._part_widths:
            out.append(weight[:, start + side * width : start + (side + 1) * width])
            start += 3 * width
        return out

    def _text_terms(self, emb: PairEmbeddings, side: int) -> Tensor:
        """[N, h1]: the first hidden layer's term of each row of ``emb`` as side ``side`` of a pair (no bias)."""
        terms = [
            nn.functional.linear(getattr(emb, p), w)
            for p, w in zip(self._parts, self._first_weights(side), strict=True)
        ]
        return terms[0] if len(terms) == 1 else terms[0] + terms[1]

    def _difference_terms(self, pairs: list[tuple[Tensor, Tensor]]) -> Tensor:
        """[P, h1]: the first hidden layer's term of |a − b| of each part's (a rows, b rows)."""
        terms = [
            nn.functional.linear((x - y).abs(), w) for (x, y), w in zip(pairs, self._first_weights(2), strict=True)
        ]
        return terms[0] if len(terms) == 1 else terms[0] + terms[1]

    def _after_first(self, first: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(``pre``, ``post``, logits) from the first hidden layer's output."""
        pre = first
        for layer in self.hidden[1:]:
            pre = layer(pre)
        post = self._normed(pre)
        return pre, post, self.out(post if self.drop is None else self.drop(post))


#: what :func:`head_statistics` reports per tensor (``pre``, ``post``), in the order of its [2, 6] table
HEAD_STATISTICS = ("sample_mean", "sample_mean_std", "sample_var", "sample_var_std", "feature_var_std", "zero_share")
#: the names of :func:`head_statistics_vector`'s 12 values
HEAD_STATISTIC_NAMES = tuple(f"head_{tag}_{name}" for tag in ("pre", "post") for name in HEAD_STATISTICS)


def head_statistics_vector(pre: Tensor, post: Tensor) -> Tensor:
    """:func:`head_statistics` as [12] float32 values on the inputs' device (both [B, W]), named by
    :data:`HEAD_STATISTIC_NAMES`; computed without a host read."""
    # both tensors at once: each statistic is one op for the two
    x = torch.stack([pre.detach(), post.detach()]).float()  # [2, B, W]
    mean = x.mean(dim=-1)  # [2, B]
    # variances from centred squares: torch's var() takes a slow path on a CPU for these shapes
    var = (x - mean[..., None]).square_().mean(dim=-1)
    feature_var = (x - x.mean(dim=-2, keepdim=True)).square_().mean(dim=-2)  # [2, W]
    return torch.stack(
        [
            mean.mean(dim=-1),
            mean.std(dim=-1, unbiased=False),
            var.mean(dim=-1),
            var.std(dim=-1, unbiased=False),
            feature_var.std(dim=-1, unbiased=False),
            (x == 0).float().mean(dim=(-2, -1)),
        ],
        dim=-1,
    ).flatten()  # [2, 6] → [12]


def head_statistics(pre: Tensor, post: Tensor) -> dict[str, Tensor]:
    """Statistics of what the output layer reads, before (``pre``) and after (``post``) its norm and activation
    (:meth:`PairHead.forward`; without hidden layers ``pre`` is the pair features).

    Both tensors are [B, W]. Per-sample mean/variance (averaged over samples, and their std across samples),
    the spread (std) of per-feature variances, and the share of exact zeros. Values are 0-d tensors on the
    input's device, keyed ``head_{pre|post}_{name}`` (name in :data:`HEAD_STATISTICS`).
    """
    return dict(zip(HEAD_STATISTIC_NAMES, head_statistics_vector(pre, post).unbind(), strict=True))
