"""The checks of a config's keys as such: every bool, int and float key holds a value of its type (:func:`check_types`,
:func:`typed_keys`), and no key is one the schema does not know (:func:`check_known_keys`,
:func:`unknown_key_message`, which Hydra's errors reuse). :mod:`.validation` runs them before its checks of values."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import typing

from omegaconf import DictConfig, OmegaConf

from ...errors import ConfigError
from .schema import LOSS_OPTIONS, LoggerSchema, MlflowSchema, Schema, TensorBoardSchema, loss_keys
from .settings import flatten


@functools.lru_cache(maxsize=1)
def typed_keys() -> tuple[tuple[str, type, bool, typing.Any], ...]:
    """``(key, kind, nullable, default)`` for every key of the schema whose type is ``bool``, ``int`` or ``float``
    (``kind``), each loss option's keys included: whether the schema allows null there, and its default."""
    found: dict[str, tuple[type, bool, typing.Any]] = {}

    def walk(cls: type, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            key, hint = prefix + f.name, hints[f.name]
            nullable = type(None) in typing.get_args(hint)
            kinds = [a for a in typing.get_args(hint) if a is not type(None)] if nullable else [hint]
            kind = kinds[0] if len(kinds) == 1 else None
            if key == "loss":
                for option in LOSS_OPTIONS.values():
                    walk(option, "loss.")
            elif dataclasses.is_dataclass(kind):
                walk(kind, key + ".")
            elif kind in (bool, int, float):
                found.setdefault(key, (kind, nullable, f.default))

    walk(Schema, "")
    return tuple((key, *about) for key, about in found.items())


def _is_of_kind(value: object, kind: type) -> bool:
    """A bool is a bool only (not an int: ``True`` is one to Python); an int is an int; a float is any finite int or
    float."""
    if kind is bool or isinstance(value, bool):
        return kind is bool and isinstance(value, bool)
    if kind is int:
        return isinstance(value, int)
    return isinstance(value, (int, float)) and math.isfinite(value)


_ABSENT = object()  # OmegaConf.select's default for a key the config lacks (None is a value)


def check_types(cfg: DictConfig) -> None:
    """Refuse a value of another type than its key's (:func:`typed_keys`) in one line that names the key, the value
    and what to put there: a bool, a string or a null (where the schema allows none) for an int or a float, a float
    for an int, a non-finite float, anything but true or false for a bool. Hydra's composition refuses these on the
    command line; a plain config (the engine from Python) has no other check. A key the config lacks is not checked
    here."""
    for key, kind, nullable, default in typed_keys():
        value = OmegaConf.select(cfg, key, default=_ABSENT)
        if value is _ABSENT or (value is None and nullable) or _is_of_kind(value, kind):
            continue
        if kind is bool:
            raise ConfigError(f"{key}={value!r} is not a boolean: use {key}=true or {key}=false")
        what = "an integer" if kind is int else "a finite number"
        shown = "null" if default is None else default
        raise ConfigError(
            f"{key}={value!r} is not {what}: set it to one{', or null' if nullable else ''} "
            f"(the default: {key}={shown})"
        )


#: subtrees whose keys are free-form (passed on to another library)
FREE_FORM = ("model.encoder.random_init.",)


def check_known_keys(cfg: DictConfig) -> None:
    """Refuse any key the schema does not know, including ones added with ``+key=...`` (which Hydra lets past the
    schema), and a key of another loss than ``loss.name``; name the closest known key when there is one."""
    loss = OmegaConf.select(cfg, "loss.name", default=None)
    option = OmegaConf.get_type(cfg, "loss") if "loss" in cfg else None
    if option in LOSS_OPTIONS.values() and loss in LOSS_OPTIONS and LOSS_OPTIONS[loss] is not option:
        raise ConfigError(f"loss.name={loss} does not switch the loss: pick it with loss={loss} (the config group)")
    for key in sorted(flatten(OmegaConf.to_container(cfg, resolve=False))):
        message = unknown_key_message(key, loss)
        if message:
            raise ConfigError(message)


@functools.lru_cache(maxsize=1)
def _known_keys() -> tuple[frozenset[str], frozenset[str]]:
    """(every key of the schema, every prefix of one): built once per process, not once per key checked."""
    # optional subtrees (the loggers) count with their keys, whether or not a run selects them; so do every loss's
    every = Schema(logger=LoggerSchema(tensorboard=TensorBoardSchema(), mlflow=MlflowSchema()))
    known = set(flatten(OmegaConf.to_container(OmegaConf.structured(every), resolve=False)))
    known.update(f"loss.{key}" for name in LOSS_OPTIONS for key in loss_keys(name))
    # an unselected optional subtree (logger.mlflow: null) is a known prefix
    return frozenset(known), frozenset(k.rsplit(".", i)[0] for k in known for i in range(1, k.count(".") + 1))


def unknown_key_message(key: str, loss: str | None = None) -> str | None:
    """The one line for a config key the schema does not know (with the closest known key, if any), or None when it
    is known. With ``loss`` (the chosen ``loss.name``), a ``loss.*`` key of another loss is not known either: the
    line names the key and the losses it belongs to. Also used for Hydra's own refusal of ``trainer.epochs=3``,
    whose hint (``+trainer.epochs=3``) would only lead to this line, and of ``loss=infonce loss.margin=1``
    (:mod:`biencoder.hydra_glue`)."""
    known, prefixes = _known_keys()
    parent, _, leaf = key.rpartition(".")
    if parent == "loss" and loss in LOSS_OPTIONS and leaf != "name" and leaf not in loss_keys(loss):
        owners = [name for name in LOSS_OPTIONS if leaf in loss_keys(name)]
        if owners:
            return f"{key} is a key of loss={'|'.join(owners)}, not of loss={loss}: drop it, or pick loss={owners[0]}"
        # misspelt: the closest key is one of the chosen loss's
        known = frozenset(k for k in known if not k.startswith("loss.")) | {
            f"loss.{k}" for k in ("name", *loss_keys(loss))
        }
    if key in known or key in prefixes or key.startswith(FREE_FORM):
        return None
    siblings = sorted(k.rpartition(".")[2] for k in known if k.rpartition(".")[0] == parent)
    close = difflib.get_close_matches(leaf, siblings, n=1, cutoff=0.75)
    hint = f" (did you mean {parent + '.' if parent else ''}{close[0]}?)" if close else ""
    return f"unknown config key {key}{hint}: fix its spelling, or see every key with --cfg job"
