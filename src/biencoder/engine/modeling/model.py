"""The bi-encoder: a shared HF encoder, a sim head and a pair classifier with optional LayerNorm / ReLU.

Reference: the ablation of Wachsmuth-style counter-argument retrieval with a BERT bi-encoder; the flags
``use_layernorm`` / ``use_relu`` decide what sits in front of the classifier's output layer. Here: the modules
(:class:`Embeddings`, :class:`PairHead`, :class:`BiModel`), building them (:func:`build_model`), the encoder's
attention mask (:func:`encoder_mask`) and the head statistics; running texts through them is
:mod:`biencoder.engine.modeling.encoding`.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import version

import torch
from torch import Tensor, nn

from ...errors import ConfigError
from ..config.schema import EncoderSchema, EvalSchema, HeadSchema, ModelSchema

_TRANSFORMERS_MAJOR = int(version("transformers").split(".")[0])


@dataclass
class Embeddings:
    """Per-argument embeddings: ``sim`` [N, sim_dim] (retrieval space) and ``pooled`` [N, hidden] (encoder)."""

    sim: Tensor
    pooled: Tensor

    def __len__(self) -> int:
        return self.sim.shape[0]

    def index(self, rows) -> Embeddings:
        """The rows ``rows`` (ints, a repeat allowed), with ``index_select``: on a CPU 3x faster than ``tensor[rows]``
        (aten::index), the same values."""
        rows = torch.as_tensor(rows, dtype=torch.long, device=self.sim.device)
        return Embeddings(self.sim.index_select(0, rows), self.pooled.index_select(0, rows))

    def to(self, device) -> Embeddings:
        return Embeddings(self.sim.to(device), self.pooled.to(device))

    def retrieval(self, space: str = EvalSchema.retrieve) -> Tensor:
        """The vectors candidates are retrieved by (nearest by Euclidean distance): ``sim``, or ``encoder`` = the
        L2-normalised pooled vectors, whose Euclidean order is the encoder's own cosine order."""
        if space == "sim":
            return self.sim
        if space == "encoder":
            return nn.functional.normalize(self.pooled.float(), dim=1)
        raise ValueError(f"unknown retrieval space '{space}'")

    def chunk(self, n: int) -> list[Embeddings]:
        """Split the rows into ``n`` equal consecutive parts."""
        return [Embeddings(s, p) for s, p in zip(self.sim.chunk(n), self.pooled.chunk(n), strict=True)]


#: the embeddings each ``model.fusion`` puts in the pair features, in order; each adds [a, b, |a − b|] of it
FUSION_PARTS = {"concat": ("sim", "pooled"), "sim": ("sim",), "cls": ("pooled",)}


class PairHead(nn.Module):
    """The pair classifier: fused features of (a, b) → optional LayerNorm → optional ReLU → ``Linear(F, 2)``.

    Shared by :class:`BiModel` and the exported ``PairClassifier`` (``biencoder.export``): one definition.
    """

    def _make_head(self, fusion: str, sim_dim: int, hidden: int, use_layernorm: bool, use_relu: bool) -> None:
        self.fusion = fusion
        n_features = sum(3 * {"sim": sim_dim, "pooled": hidden}[part] for part in FUSION_PARTS[fusion])
        self.norm = nn.LayerNorm(n_features) if use_layernorm else nn.Identity()
        self.act = nn.ReLU() if use_relu else nn.Identity()
        self.out = nn.Linear(n_features, 2)

    def pair_features(self, a: Embeddings, b: Embeddings) -> Tensor:
        """Fused features [B, n_features] of the pairs (a[i], b[i])."""
        parts = []
        for part in FUSION_PARTS[self.fusion]:
            x, y = getattr(a, part), getattr(b, part)
            parts += [x, y, (x - y).abs()]
        return torch.cat(parts, dim=-1)

    def gather_pair_features(self, emb: Embeddings, rows_a: Tensor, rows_b: Tensor, out: Tensor) -> Tensor:
        """:meth:`pair_features` of (emb[rows_a[i]], emb[rows_b[i]]) written into ``out`` [≥ B, n_features] (no
        autograd; ``out`` of the embeddings' dtype): the rows are gathered straight into their places, with no
        intermediate tensors. The same values; the margins of a split's shortlists took 13–42 % less time on a CPU
        (``scripts/bench.py --items eval``). Returns ``out[:B]``."""
        if out.shape[0] < len(rows_a) or out.shape[1] != self.out.in_features:
            raise ValueError(
                f"a buffer of {tuple(out.shape)} cannot hold the features of {len(rows_a)} pairs "
                f"({self.out.in_features} each)"
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

    def head(self, features: Tensor) -> tuple[Tensor, Tensor]:
        """Features [B, F] → (head input after the optional LayerNorm/ReLU [B, F], logits [B, 2])."""
        head_input = self.act(self.norm(features))
        return head_input, self.out(head_input)

    def classify_pair(self, point: Embeddings, candidate: Embeddings) -> Tensor:
        """Logits [B, 2] for (point[i], candidate[i]); class 1 = the candidate counters the point."""
        return self.head(self.pair_features(point, candidate))[1]


class BiModel(PairHead):
    """Shared encoder → pooled embedding → ``Linear(hidden, sim_dim)``; pair classifier over fused features.

    Args:
        encoder: a HF ``PreTrainedModel`` (BERT family); used for points, counters and negatives alike.
        sim_dim: size of the retrieval embedding.
        pooling: ``mean`` (masked mean), ``cls`` (first token) or ``pooler`` (BERT pooler output).
        fusion: pair features; ``concat`` = [s_a, s_b, |s_a−s_b|, p_a, p_b, |p_a−p_b|], ``sim`` = the s part,
            ``cls`` = the p part (s = sim embedding, p = pooled embedding).
        use_layernorm: LayerNorm over the feature vector before the output layer.
        use_relu: ReLU (after the LayerNorm, if any) before the output layer.

    The defaults are the schema's (``model.sim_dim``, ``model.pooling``, ``model.fusion``, ``model.head.*``):
    ``BiModel(encoder)`` is the model the default config builds around ``encoder`` (:func:`bimodel`).
    """

    def __init__(
        self,
        encoder: nn.Module,
        sim_dim: int = ModelSchema.sim_dim,
        pooling: str = ModelSchema.pooling,
        fusion: str = ModelSchema.fusion,
        use_layernorm: bool = HeadSchema.use_layernorm,
        use_relu: bool = HeadSchema.use_relu,
    ):
        super().__init__()
        hidden = encoder.config.hidden_size
        if pooling == "pooler" and getattr(encoder, "pooler", None) is None:
            raise ConfigError(
                f"model.pooling=pooler but {type(encoder).__name__} has no pooler: use model.pooling=cls or mean"
            )
        self.encoder = encoder
        self.pooling = pooling
        self.sim_head = nn.Linear(hidden, sim_dim)
        self._make_head(fusion, sim_dim, hidden, use_layernorm, use_relu)  # after sim_head: the same init as ever

    @torch.no_grad()
    def init_sim_from_pca(self, pooled: Tensor) -> None:
        """Start the sim head as the projection on the top ``sim_dim`` principal components of ``pooled`` [N, hidden].

        sim(x) = V_k^T (x - mean): distances in the sim space start as the encoder's own pooled distances within
        its main directions, instead of those of a random projection. Computed in float64 on the CPU (the same
        on every rank); rows beyond the data's rank (sim_dim > hidden) start at zero.
        """
        x = pooled.detach().to("cpu", torch.float64)
        mean = x.mean(dim=0)
        _, _, vh = torch.linalg.svd(x - mean, full_matrices=False)
        weight = torch.zeros(self.sim_head.weight.shape, dtype=torch.float64)
        n = min(len(weight), len(vh))
        weight[:n] = vh[:n]
        self.sim_head.weight.copy_(weight)
        self.sim_head.bias.copy_(-(weight @ mean))

    def pool(self, input_ids: Tensor, attention_mask: Tensor, padded: bool | None = None) -> Tensor:
        """Token ids [B, L] and mask [B, L] → pooled encoder output [B, hidden].

        ``padded`` (known on the host from the token lengths:
        :meth:`~biencoder.engine.modeling.encoding.TokenizedTexts.batch`) lets an SDPA encoder skip the host sync of
        transformers' own check of the mask (:func:`encoder_mask`); None: the 2-D mask as is.
        """
        output = self.encoder(input_ids=input_ids, attention_mask=encoder_mask(self.encoder, attention_mask, padded))
        if self.pooling == "pooler":
            return output.pooler_output
        if self.pooling == "cls":
            return output.last_hidden_state[:, 0]
        mask = attention_mask.unsqueeze(-1).to(output.last_hidden_state.dtype)
        return (output.last_hidden_state * mask).sum(1) / mask.sum(1).clamp(min=1.0)

    def from_pooled(self, pooled: Tensor) -> Embeddings:
        """Pooled vectors [B, hidden] → :class:`Embeddings` (the sim head applied)."""
        return Embeddings(self.sim_head(pooled), pooled)

    def embed(self, input_ids: Tensor, attention_mask: Tensor, padded: bool | None = None) -> Embeddings:
        """Token ids [B, L] and mask [B, L] → :class:`Embeddings` with sim [B, sim_dim], pooled [B, hidden]."""
        return self.from_pooled(self.pool(input_ids, attention_mask, padded))

    def head_parameters(self) -> list[nn.Parameter]:
        return [p for name, p in self.named_parameters() if not is_encoder_weight(name)]

    def unused_parameters(self) -> list[nn.Parameter]:
        """The parameters no training loss reaches: the encoder's pooler, unless ``pooling="pooler"`` uses it."""
        pooler = getattr(self.encoder, "pooler", None)
        return [] if pooler is None or self.pooling == "pooler" else list(pooler.parameters())


def is_encoder_weight(name: str) -> bool:
    """True for a :class:`BiModel` parameter or state-dict key of the shared encoder (the rest are the heads)."""
    return name.startswith("encoder.")


#: encoders whose SDPA attention builds exactly a two-way padding mask from the 2-D one (transformers 5): for these
#: :func:`encoder_mask` gives the same outputs to the bit (tests/engine/modeling/test_model.py runs each); others keep
#: the 2-D mask. Not here on purpose: decoders (causal masks), ModernBERT (sliding-window layers take a mask of their
#: own)
HOST_MASK_MODEL_TYPES = ("bert", "roberta", "xlm-roberta", "electra", "albert", "distilbert")


def encoder_mask(encoder: nn.Module, attention_mask: Tensor, padded: bool | None) -> Tensor | None:
    """The attention mask to give ``encoder`` for a batch whose 2-D ``attention_mask`` [B, L] has padding or not.

    A BERT-family SDPA encoder (transformers 5) turns the 2-D mask into None when nothing is padded and else into
    the boolean [B, 1, L, L] mask of the padding, and decides which by ``mask.all()``: a read of the device's mask by
    the host, a sync in every forward. With ``padded`` known on the host, the same mask is built here (a 4-D mask is
    passed through as is), so no forward waits; the outputs are the same to the bit
    (tests/engine/modeling/test_model.py). Every other encoder (a model type not in :data:`HOST_MASK_MODEL_TYPES`, a
    decoder, another attention implementation, transformers 4) and ``padded`` None get the 2-D mask.
    """
    config = encoder.config
    if (
        padded is None
        or getattr(config, "_attn_implementation", None) != "sdpa"
        or _TRANSFORMERS_MAJOR < 5
        or config.model_type not in HOST_MASK_MODEL_TYPES
        or getattr(config, "is_decoder", False)
    ):
        return attention_mask
    if not padded:
        return None
    batch, length = attention_mask.shape
    return attention_mask.bool()[:, None, None, :].expand(batch, 1, length, length)


def load_encoder(name_or_path: str, random_init: dict | None = EncoderSchema.random_init, progress: bool = True):
    """Return (encoder, tokenizer) for a HF id or folder.

    With ``random_init`` (a dict of config overrides such as ``num_hidden_layers``) the architecture is
    taken from ``name_or_path``'s config with those overrides and initialised randomly (current torch seed);
    the tokenizer is always ``name_or_path``'s.
    """
    from transformers import AutoConfig, AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    if not progress:
        hf_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
        if random_init:
            config = AutoConfig.from_pretrained(name_or_path, **dict(random_init))
            encoder = AutoModel.from_config(config)
        else:
            encoder = AutoModel.from_pretrained(name_or_path)
    except (OSError, ValueError) as err:  # ValueError: a malformed hub id (HFValidationError)
        raise ConfigError(
            f"cannot load encoder '{name_or_path}' ({str(err).splitlines()[0]}): set model.encoder.name_or_path "
            "to a local HF folder, or to a hub id while online"
        ) from None
    return encoder, tokenizer


def build_model(model_cfg, progress: bool = True) -> tuple[BiModel, object]:
    """BiModel and tokenizer from the ``model`` config group, a DictConfig or a plain dict (as in best.pt).

    Seed torch first for a reproducible initialisation of the heads (and of a ``random_init`` encoder).
    """
    from omegaconf import OmegaConf

    model_cfg = OmegaConf.create(model_cfg) if isinstance(model_cfg, dict) else model_cfg
    encoder, tokenizer = load_encoder(model_cfg.encoder.name_or_path, model_cfg.encoder.get("random_init"), progress)
    limit = getattr(encoder.config, "max_position_embeddings", None)
    if limit is not None and model_cfg.max_length > limit:
        raise ConfigError(
            f"model.max_length={model_cfg.max_length} is above the encoder's limit of {limit} "
            f"positions: use model.max_length={limit} or less"
        )
    return bimodel(encoder, model_cfg), tokenizer


def bimodel(encoder: nn.Module, model_cfg) -> BiModel:
    """:class:`BiModel` around ``encoder`` with the heads the ``model`` config (a DictConfig or a plain dict) names."""
    head = model_cfg["head"]
    return BiModel(
        encoder,
        sim_dim=model_cfg["sim_dim"],
        pooling=model_cfg["pooling"],
        fusion=model_cfg["fusion"],
        use_layernorm=head["use_layernorm"],
        use_relu=head["use_relu"],
    )


#: what :func:`head_statistics` reports per tensor (``pre``, ``post``), in the order of its [2, 6] table
HEAD_STATISTICS = ("sample_mean", "sample_mean_std", "sample_var", "sample_var_std", "feature_var_std", "zero_share")
#: the names of :func:`head_statistics_vector`'s 12 values
HEAD_STATISTIC_NAMES = tuple(f"head_{tag}_{name}" for tag in ("pre", "post") for name in HEAD_STATISTICS)


def head_statistics_vector(features: Tensor, head_input: Tensor) -> Tensor:
    """:func:`head_statistics` as [12] float32 values on the inputs' device (both [B, F]), named by
    :data:`HEAD_STATISTIC_NAMES`; computed without a host read."""
    # both tensors at once: each statistic is one op for the two
    x = torch.stack([features.detach(), head_input.detach()]).float()  # [2, B, F]
    mean = x.mean(dim=-1)  # [2, B]
    # variances from centred squares: torch's var() takes a slow path on a CPU for these shapes (4-5x)
    var = (x - mean[..., None]).square_().mean(dim=-1)
    feature_var = (x - x.mean(dim=-2, keepdim=True)).square_().mean(dim=-2)  # [2, F]
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


def head_statistics(features: Tensor, head_input: Tensor) -> dict[str, Tensor]:
    """Statistics of the classifier input before (``pre``) and after (``post``) the optional LayerNorm/ReLU.

    Both tensors are [B, F]. Per-sample mean/variance (averaged over samples, and their std across samples),
    the spread (std) of per-feature variances, and the share of exact zeros. Values are 0-d tensors on the
    input's device, keyed ``head_{pre|post}_{name}`` (name in :data:`HEAD_STATISTICS`).
    """
    return dict(zip(HEAD_STATISTIC_NAMES, head_statistics_vector(features, head_input).unbind(), strict=True))
