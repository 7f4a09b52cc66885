"""The pair head's specification: what ``model.head.*`` says together (:func:`head_spec`), the name it gives a cell
(:func:`head_name`, :func:`variant_name`) and a user's own component by import path (:func:`component_factory`).

The one rule relating the card's flags and the head keys (docs/heads.md): every key that is set must be true of the
head. ``norm`` and ``activation`` name a component (null: not said); ``use_layernorm=true`` says the norm is
LayerNorm and ``false`` that it is not; ``use_relu`` says the same of ReLU and the activation. What nothing says is
``none``. A pair that cannot both be true (``use_layernorm=true`` with ``norm=rmsnorm``, ``use_relu=false`` with
``activation=relu``) is refused in one line. So the four card variants, which set both flags, build what they always
built, and ``model.head.norm=rmsnorm`` works alone on the default config, where both flags are null.

Torch-free and Hydra-free like :mod:`.schema`: a user's component is imported (``importlib``) but never called here.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Mapping
from dataclasses import dataclass

from ...errors import ConfigError
from .schema import HeadSchema

#: each flag of the card -> the key it speaks of and the value it names
FLAGS = {"use_layernorm": ("norm", "layernorm"), "use_relu": ("activation", "relu")}
#: the short names of components in a head's name (the card's cells are named ln, relu, ln_relu, plain)
SHORT_NAMES = {"layernorm": "ln"}


@dataclass(frozen=True)
class HeadSpec:
    """A resolved head: ``norm`` (one of :data:`~.schema.NORMS` or an import path), ``activation`` (one of
    :data:`~.schema.ACTIVATIONS` or an import path), ``dropout`` (a probability) and ``hidden`` (the widths of the
    hidden layers, in order; empty: the output layer alone). :func:`head_spec` makes one of a config."""

    norm: str
    activation: str
    dropout: float
    hidden: tuple[int, ...]

    def as_config(self) -> dict:
        """The ``model.head`` keys that build this head, flags left out (an export's ``config.json``)."""
        return {"norm": self.norm, "activation": self.activation, "dropout": self.dropout, "hidden": list(self.hidden)}


def head_spec(head: Mapping | None) -> HeadSpec:
    """The head that ``head`` (the ``model.head`` config: a DictConfig, or a plain dict as ``best.pt`` holds it; a key
    it lacks takes the schema's default) describes, by the rule of this module. Raises :class:`ConfigError` for a flag
    and a key that contradict each other. The values themselves are checked by
    :func:`~.validation.validate` (a config) or when the head is built (a checkpoint)."""
    head = dict(head or {})
    default = HeadSchema()
    named = {}
    for flag, (key, value) in FLAGS.items():
        said, flag_value = head.get(key, getattr(default, key)), head.get(flag, getattr(default, flag))
        if flag_value is not None and said is not None and (said == value) != bool(flag_value):
            raise ConfigError(
                f"model.head.{flag}={str(bool(flag_value)).lower()} and model.head.{key}={said} contradict each "
                f"other: drop one of them (a variant file's flag: add model.head.{flag}=null), docs/heads.md"
            )
        named[key] = str(said) if said is not None else (value if flag_value else "none")
    dropout = head.get("dropout", default.dropout)
    hidden = head.get("hidden", default.hidden)
    return HeadSpec(named["norm"], named["activation"], float(dropout), tuple(int(width) for width in hidden))


def head_name(spec: HeadSpec) -> str:
    """The name of a head, as cells and run folders show it: its hidden widths (``h256``, ``h512x128``), norm
    (``ln`` for LayerNorm), activation and dropout (``drop0.1``) joined by ``_``, each left out when absent, and
    ``plain`` for none of them. So the card's heads are named ``ln_relu``, ``ln``, ``relu`` and ``plain``; a user's
    component by its import path (``mypkg.norms.ScaleNorm``: ``:`` becomes ``.``, so the name fits a folder's)."""
    parts = [f"h{'x'.join(map(str, spec.hidden))}"] if spec.hidden else []
    parts += [SHORT_NAMES.get(v, v).replace(":", ".") for v in (spec.norm, spec.activation) if v != "none"]
    if spec.dropout:
        parts.append(f"drop{spec.dropout:g}")
    return "_".join(parts) or "plain"


def variant_name(cfg, choice: str | None = None) -> str:
    """A run's variant: ``choice`` (the ``+variant=`` option it was composed with) when given, else the name of the
    head its ``model.head`` describes (:func:`head_name`: ``ln_relu``, ``rmsnorm_gelu``, ...). The one rule for the
    run folder's name (``${variant_name:}``), the apps and the runner. A head whose keys contradict each other is
    named ``invalid-head`` here; validation refuses it before anything runs."""
    if choice:
        return str(choice)
    try:
        return head_name(head_spec(cfg.model.head))
    except ConfigError:
        return "invalid-head"


def is_import_path(value: str) -> bool:
    """A value of ``model.head.norm`` or ``.activation`` that names a factory of the user's own (``pkg.mod:factory``
    or ``pkg.mod.factory``) rather than a built-in component."""
    return "." in value or ":" in value


def check_component(key: str, value, choices: tuple[str, ...]) -> None:
    """Refuse ``model.head.<key>=value`` unless it is null, one of ``choices`` or an importable factory, in one line
    naming the key, the allowed values and the closest choice."""
    if value is None or value in choices:
        return
    if isinstance(value, str) and is_import_path(value):
        component_factory(f"model.head.{key}", value)
        return
    close = difflib.get_close_matches(str(value).lower(), choices, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]}?)" if close else ""
    raise ConfigError(
        f"model.head.{key}={value!r} is not valid{hint}: use one of {', '.join(choices)}, or a factory of your own "
        "as module:name (docs/heads.md)"
    )


def component_factory(key: str, path: str):
    """The callable that ``path`` (``pkg.mod:factory``, ``pkg.mod:Class.factory`` or ``pkg.mod.factory``) names,
    imported now. Raises :class:`ConfigError` in one line when its module is not installed (naming what to install)
    or has no such callable. ``key`` names the config key for the message."""
    module_name, _, attr = path.partition(":") if ":" in path else path.rpartition(".")
    if not module_name or not attr:
        raise ConfigError(
            f"{key}={path!r} is not an import path: write it as module:factory, e.g. mypkg.norms:ScaleNorm"
        )
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        missing = err.name or module_name
        raise ConfigError(
            f"{key}={path!r} needs the module '{missing}', which is not installed here: install the package that "
            f"provides it, or put its folder on PYTHONPATH"
        ) from None
    found = module
    for part in attr.split("."):
        found = getattr(found, part, None)
    if not callable(found):
        raise ConfigError(
            f"{key}={path!r}: module '{module_name}' has no callable '{attr}': name a factory that takes the width "
            "and returns a torch.nn.Module (docs/heads.md)"
        )
    return found
