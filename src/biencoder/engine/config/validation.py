"""The checks of a composed config: :func:`validate` names the first bad value in one line (a :class:`ConfigError`)
before anything is touched; :func:`check_known_keys` refuses a key the schema does not know.

Types and unknown keys are also refused by Hydra's composition against :mod:`.schema`; these checks add ranges,
choices and combinations, and run on plain ``DictConfig`` objects too (the engine without Hydra), where nothing else
checks types: every bool, int and float key of the schema is checked against its type (:func:`check_types`), and a
key of another loss is refused against the chosen loss's option
(:data:`~biencoder.engine.config.schema.LOSS_OPTIONS`), as composition refuses both.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import typing

from omegaconf import DictConfig, OmegaConf

from ...errors import ConfigError
from .schema import (
    DEVICES,
    FUSIONS,
    INDEXES,
    LAYOUTS,
    LOSS_OPTIONS,
    PAIR_FORMATS,
    POOLINGS,
    POOLS,
    PRECISIONS,
    PROTOCOLS,
    RETRIEVE_SPACES,
    SCHEDULERS,
    SCORES,
    SIM_INITS,
    ColumnsSchema,
    LoggerSchema,
    MlflowSchema,
    Schema,
    TensorBoardSchema,
    loss_keys,
)
from .settings import flatten


def _choice(cfg: DictConfig, key: str, allowed: tuple[str, ...]) -> None:
    value = OmegaConf.select(cfg, key)
    if str(value) not in allowed:
        raise ConfigError(f"{key}={value!r} is not valid: use one of {', '.join(allowed)}")


def _positive(cfg: DictConfig, key: str, kind=int, minimum=1) -> None:
    """``key`` must be a number of ``kind`` (an int also passes as a float) and at least ``minimum``."""
    value = OmegaConf.select(cfg, key)
    allowed = (int,) if kind is int else (int, float)
    if isinstance(value, bool) or not isinstance(value, allowed) or not math.isfinite(value) or value < minimum:
        raise ConfigError(
            f"{key}={value!r} is not valid: it must be {'an int' if kind is int else 'a number'} >= {minimum}"
        )


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


def _loss(cfg: DictConfig) -> None:
    """``loss.name`` is a known loss and its keys are in range (a key of another loss: :func:`check_known_keys`)."""
    _choice(cfg, "loss.name", tuple(LOSS_OPTIONS))
    reads = loss_keys(cfg.loss.name)
    for key in ("margin", "triplet_weight", "ce_weight", "scale"):
        if key in reads:
            _positive(cfg, f"loss.{key}", kind=float, minimum=0)
    if "scale" in reads and cfg.loss.scale == 0:
        raise ConfigError("loss.scale=0 is not valid: every score would be 0; use a number > 0 (20 is the usual one)")


def validate(cfg: DictConfig) -> None:
    """Check every value the runner relies on; raise :class:`ConfigError` naming the first bad one. The apps call
    it once per run, before any folder is touched (with :func:`biencoder.engine.runs.tracking.check_packages` for the
    trackers, which needs the installed packages, not the config alone)."""
    check_known_keys(cfg)
    check_types(cfg)  # first: the range checks below compare numbers
    for check in (_model, _trainer, _loss, _negatives, _eval, _data):
        check(cfg)


def _model(cfg: DictConfig) -> None:
    _choice(cfg, "model.pooling", POOLINGS)
    _choice(cfg, "model.fusion", FUSIONS)
    _choice(cfg, "model.sim_init", SIM_INITS)
    _positive(cfg, "model.sim_dim")
    _positive(cfg, "model.max_length", minimum=8)


def _trainer(cfg: DictConfig) -> None:
    _choice(cfg, "trainer.device", DEVICES)
    _choice(cfg, "trainer.precision", PRECISIONS)
    _choice(cfg, "trainer.scheduler", SCHEDULERS)
    warmup = cfg.trainer.warmup_ratio
    if not 0 <= warmup < 1:
        raise ConfigError(f"trainer.warmup_ratio={warmup!r} is not valid: it must be in [0, 1)")
    graphs = cfg.trainer.cuda_graphs
    if not (isinstance(graphs, bool) or graphs == "auto"):
        raise ConfigError(f"trainer.cuda_graphs={graphs!r} is not valid: use auto, true or false")
    if cfg.trainer.progress not in (True, False, "auto"):
        raise ConfigError(f"trainer.progress={cfg.trainer.progress!r} is not valid: use auto, true or false")
    resume = cfg.trainer.resume
    if not isinstance(resume, (bool, str)):
        raise ConfigError(f"trainer.resume={resume!r} is not valid: use true, false or a run folder")
    for key in ("max_epochs", "batch_size", "stats_every"):
        _positive(cfg, f"trainer.{key}")
    if cfg.trainer.eval_batch_size is not None:
        _positive(cfg, "trainer.eval_batch_size")
    _positive(cfg, "trainer.num_workers", minimum=0)
    _positive(cfg, "trainer.checkpoint_every", minimum=0)
    _positive(cfg, "trainer.lr", kind=float, minimum=0)
    _positive(cfg, "trainer.head_lr", kind=float, minimum=0)


def _negatives(cfg: DictConfig) -> None:
    _choice(cfg, "negatives.index", INDEXES)
    _positive(cfg, "negatives.n_neighbors")
    for key in ("negatives.random_rate.start", "negatives.random_rate.decay"):
        _positive(cfg, key, kind=float, minimum=0)
        if OmegaConf.select(cfg, key) > 1:
            raise ConfigError(f"{key}={OmegaConf.select(cfg, key)!r} is not valid: it must be in [0, 1]")


def _eval(cfg: DictConfig) -> None:
    if cfg.eval.retrieve is not None or cfg.task_name != "evaluate":
        _choice(cfg, "eval.retrieve", RETRIEVE_SPACES)
    if cfg.eval.baselines not in (True, False, "auto"):
        raise ConfigError(f"eval.baselines={cfg.eval.baselines!r} is not valid: use auto, true or false")
    _choice(cfg, "eval.index", INDEXES)
    _positive(cfg, "eval.k")
    _positive(cfg, "eval.every")
    if cfg.eval.pair_batch_size is not None:
        _positive(cfg, "eval.pair_batch_size")
    for split in ("train", "val", "test"):
        if cfg.eval[f"{split}_queries"] is not None:
            _positive(cfg, f"eval.{split}_queries")
    _choice(cfg, "eval.score", SCORES)
    _choice(cfg, "eval.protocol", PROTOCOLS)


#: the data keys only pair files read (data.layout=pairs)
PAIR_KEYS = ("train", "val", "test", "file", "format")


def _data(cfg: DictConfig) -> None:
    _choice(cfg, "data.layout", LAYOUTS)
    _choice(cfg, "data.pool", POOLS)
    if cfg.data.max_debates is not None:
        _positive(cfg, "data.max_debates")
    if cfg.data.layout == "pairs":
        _pair_files(cfg)
        return
    if not isinstance(cfg.data.root, str) or not cfg.data.root:
        raise ConfigError(
            f"data.root={cfg.data.root!r} is not a path: use data=demo, or data=arguana with ARGUANA_ROOT set"
        )
    changed = [f"data.{k}={cfg.data[k]}" for k in PAIR_KEYS if cfg.data[k] is not None] + [
        f"data.columns.{k}={v}" for k, v in cfg.data.columns.items() if v != getattr(ColumnsSchema(), k)
    ]
    if changed:
        raise ConfigError(
            f"{changed[0]} is read only from pair files, and data={cfg.data.name} is the ArguAna layout: "
            "use data=pairs (docs/own-data.md), or drop it"
        )


def _pair_files(cfg: DictConfig) -> None:
    """data.layout=pairs: one file per split or one file with a split column, a known format, two named columns."""
    data = cfg.data
    if data.max_debates is not None:
        raise ConfigError(
            f"data.max_debates={data.max_debates} slices ArguAna's debates; pair files have none: cut "
            "the files instead, or drop it"
        )
    if data.format is not None:
        _choice(cfg, "data.format", PAIR_FORMATS)
    given = [k for k in ("train", "val", "test") if data[k] is not None]
    if data.file is not None and given:
        raise ConfigError(
            f"data.file and data.{given[0]} are both set: pass one file per split (data.train, data.val, "
            "data.test) or one file with a split column (data.file), not both"
        )
    if data.file is None and len(given) < 3:
        missing = [f"data.{k}" for k in ("train", "val", "test") if k not in given]
        raise ConfigError(
            f"data=pairs needs {', '.join(missing)}: one file per split (e.g. data.train=train.jsonl "
            "data.val=val.jsonl data.test=test.jsonl), or data.file=<one file with a split column>"
        )
    for role in ("anchor", "positive", "split"):
        if not isinstance(data.columns[role], str) or not data.columns[role]:
            raise ConfigError(
                f"data.columns.{role}={data.columns[role]!r} is not a column name: name the column that "
                f"holds the {role} texts"
            )
