"""The pair head's specification (:class:`HeadSpec`) and what a ``model.head`` config says of it (:func:`head_spec`).

``use_layernorm`` / ``use_relu`` say whether LayerNorm / ReLU sit in front of the classifier's output layer.
Torch-free and Hydra-free like :mod:`.schema`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class HeadSpec:
    """A resolved head: ``norm`` (``none`` or ``layernorm``), ``activation`` (``none`` or ``relu``), ``dropout`` (a
    probability) and ``hidden`` (the widths of the hidden layers, in order; empty: the output layer alone).
    :func:`head_spec` makes one of a config."""

    norm: str
    activation: str
    dropout: float
    hidden: tuple[int, ...]

    def as_config(self) -> dict:
        """The head's keys (an export's ``config.json``)."""
        return {"norm": self.norm, "activation": self.activation, "dropout": self.dropout, "hidden": list(self.hidden)}


def head_spec(head: Mapping | None) -> HeadSpec:
    """The head that ``head`` describes: the ``model.head`` config (a DictConfig, or a plain dict as ``best.pt``
    holds it: LayerNorm when ``use_layernorm``, ReLU when ``use_relu``) or :meth:`HeadSpec.as_config`'s keys."""
    head = dict(head or {})
    norm = head.get("norm") or ("layernorm" if head.get("use_layernorm") else "none")
    activation = head.get("activation") or ("relu" if head.get("use_relu") else "none")
    hidden = tuple(int(width) for width in head.get("hidden", ()))
    return HeadSpec(str(norm), str(activation), float(head.get("dropout", 0.0)), hidden)
