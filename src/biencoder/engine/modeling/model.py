"""The bi-encoder: a shared HF encoder, a sim head and the pair head it holds (:mod:`.head`).

Reference: the ablation of Wachsmuth-style counter-argument retrieval with a BERT bi-encoder; ``model.head``
decides what sits in front of the classifier's output layer (docs/heads.md). Here: :class:`Embeddings`,
:class:`BiModel` and the state-dict keys of the layout before the head was a component (:func:`renamed_head_keys`),
building them (:func:`build_model`) and the encoder's attention mask (:func:`encoder_mask`); running texts through
them is :mod:`biencoder.engine.modeling.encoding`.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import version

import torch
from torch import Tensor, nn

from ...errors import ConfigError
from ..config.heads import HeadSpec, head_spec
from ..config.schema import EncoderSchema, EvalSchema, ModelSchema
from .head import PairHead

_TRANSFORMERS_MAJOR = int(version("transformers").split(".")[0])


@dataclass
class Embeddings:
    """Per-argument embeddings: ``sim`` [N, sim_dim] (retrieval space) and ``pooled`` [N, hidden] (encoder)."""

    sim: Tensor
    pooled: Tensor

    def __len__(self) -> int:
        return self.sim.shape[0]

    def index(self, rows) -> Embeddings:
        """The rows ``rows`` (ints, a repeat allowed), gathered with ``index_select`` (on a CPU a faster kernel than
        ``tensor[rows]``'s aten::index; the same values)."""
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


class BiModel(nn.Module):
    """Shared encoder → pooled embedding → ``Linear(hidden, sim_dim)``; the pair head (:class:`PairHead`) over fused
    features, held as ``model.head``.

    Args:
        encoder: a HF ``PreTrainedModel`` (BERT family); used for points, counters and negatives alike.
        sim_dim: size of the retrieval embedding.
        pooling: ``mean`` (masked mean), ``cls`` (first token) or ``pooler`` (BERT pooler output).
        fusion: pair features; ``concat`` = [s_a, s_b, |s_a−s_b|, p_a, p_b, |p_a−p_b|], ``sim`` = the s part,
            ``cls`` = the p part (s = sim embedding, p = pooled embedding).
        head: the pair head's specification (:func:`~biencoder.engine.config.heads.head_spec`); None: the default
            config's (no norm, no activation, no dropout, no hidden layer).

    The defaults are the schema's (``model.sim_dim``, ``model.pooling``, ``model.fusion``, ``model.head.*``):
    ``BiModel(encoder)`` is the model the default config builds around ``encoder`` (:func:`bimodel`). A state dict
    of the layout before the head was a component (its keys ``norm.*``, ``out.*``) loads as it always did
    (:func:`renamed_head_keys`).
    """

    def __init__(
        self,
        encoder: nn.Module,
        sim_dim: int = ModelSchema.sim_dim,
        pooling: str = ModelSchema.pooling,
        fusion: str = ModelSchema.fusion,
        head: HeadSpec | None = None,
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
        # after sim_head: the weights are drawn in the same order as when the head's layers were the model's own
        self.head = PairHead(fusion, sim_dim, hidden, head_spec(None) if head is None else head)
        self.register_load_state_dict_pre_hook(_rename_old_head_keys)

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


#: the top-level modules of the pair head before it was a component of its own (now under ``head.``)
OLD_HEAD_MODULES = ("norm.", "out.")


def renamed_head_keys(state_dict: dict, prefix: str = "") -> dict:
    """``state_dict`` of a :class:`BiModel` (its keys under ``prefix``) with the keys of the old layout, where the
    pair head's modules were the model's own (``norm.*``, ``out.*``: ``best.pt``, ``last.pt`` and the best weights
    they hold, written before the head was ``model.head``), renamed to ``head.norm.*``, ``head.out.*``. Keys of the
    current layout are left as they are; a new dict, in the same order."""
    return {
        (f"{prefix}head.{k[len(prefix) :]}" if k.startswith(tuple(prefix + m for m in OLD_HEAD_MODULES)) else k): v
        for k, v in state_dict.items()
    }


def _rename_old_head_keys(module, state_dict, prefix, *_) -> None:
    """``load_state_dict``'s pre-hook of :class:`BiModel`: an old state dict's head keys renamed in place."""
    renamed = renamed_head_keys(state_dict, prefix)
    if list(renamed) != list(state_dict):
        state_dict.clear()
        state_dict.update(renamed)


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
    return BiModel(
        encoder,
        sim_dim=model_cfg["sim_dim"],
        pooling=model_cfg["pooling"],
        fusion=model_cfg["fusion"],
        head=head_spec(model_cfg["head"]),
    )
