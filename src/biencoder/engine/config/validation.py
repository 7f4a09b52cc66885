"""The checks of a composed config: :func:`validate` names the first bad value in one line (a :class:`ConfigError`)
before anything is touched.

Types and unknown keys are also refused by Hydra's composition against :mod:`.schema`; these checks add ranges,
choices and combinations, and run on plain ``DictConfig`` objects too (the engine without Hydra), where nothing else
checks types: first the keys as such (:mod:`.keys`: every bool, int and float key against its type, no unknown key,
no key of another loss than the chosen one), then the values, group by group.
"""

from __future__ import annotations

import math

from omegaconf import DictConfig, ListConfig, OmegaConf

from ...errors import ConfigError
from .heads import check_component, head_spec
from .keys import check_known_keys, check_types
from .schema import (
    ACTIVATIONS,
    DEVICES,
    FUSIONS,
    INDEXES,
    LAYOUTS,
    LOSS_OPTIONS,
    NORMS,
    PAIR_FORMATS,
    POOLINGS,
    POOLS,
    PRECISIONS,
    PROTOCOLS,
    RETRIEVE_SPACES,
    SCHEDULERS,
    SCORES,
    SELECT_METRICS,
    SIM_INITS,
    ColumnsSchema,
    loss_keys,
)


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
    _head(cfg)


def _head(cfg: DictConfig) -> None:
    """``model.head``: each component a built-in or an importable factory, a dropout in [0, 1), widths >= 1, and no
    flag that contradicts its key (:func:`~.heads.head_spec`)."""
    head = cfg.model.head
    check_component("norm", head.norm, NORMS)
    check_component("activation", head.activation, ACTIVATIONS)
    if not 0 <= head.dropout < 1:
        raise ConfigError(f"model.head.dropout={head.dropout!r} is not valid: it must be a probability in [0, 1)")
    hidden = head.hidden
    is_list = OmegaConf.is_list(hidden) or isinstance(hidden, list)
    if not is_list or not all(isinstance(w, int) and not isinstance(w, bool) and w >= 1 for w in hidden):
        shown = list(hidden) if is_list else hidden
        raise ConfigError(
            f"model.head.hidden={shown!r} is not valid: it must be a list of widths >= 1, e.g. "
            "model.head.hidden=[256] (empty: no hidden layer)"
        )
    head_spec(head)


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
    if OmegaConf.select(cfg, "negatives.relative_margin") is not None:
        _positive(cfg, "negatives.relative_margin", kind=float, minimum=0)
    _rank_range(OmegaConf.select(cfg, "negatives.rank_range"))


def _rank_range(value) -> None:
    """``negatives.rank_range``: null, or [lo, hi] with integers 1 <= lo <= hi."""
    if value is None:
        return
    values = list(value) if isinstance(value, (list, ListConfig)) else None
    if (
        values is None
        or len(values) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in values)
        or not 1 <= values[0] <= values[1]
    ):
        shown = f"[{','.join(map(str, values))}]" if values is not None else repr(value)
        raise ConfigError(
            f"negatives.rank_range={shown} is not valid: use [lo,hi], integers with 1 <= lo <= hi (rank 1 is the "
            "nearest eligible argument; e.g. negatives.rank_range=[10,50]), or null for the nearest"
        )


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
    if cfg.eval.get("select") is not None:
        _choice(cfg, "eval.select", SELECT_METRICS)
        if cfg.eval.select != "retrieval_top1" and float(cfg.loss.get("ce_weight", 1.0)) == 0:
            raise ConfigError(
                f"eval.select={cfg.eval.select} reads the classifier's reranking, which loss.ce_weight=0 leaves "
                "untrained: select by retrieval_top1 (the rule's choice), or train the classifier"
            )
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
    beir = cfg.data.layout == "beir"
    if not isinstance(cfg.data.root, str) or not cfg.data.root:
        raise ConfigError(
            f"data.root={cfg.data.root!r} is not a path: "
            + (
                "name the BEIR folder (data.root=<folder>), or use data=beir_demo"
                if beir
                else "use data=demo, or data=arguana with ARGUANA_ROOT set"
            )
        )
    if beir and cfg.data.max_debates is not None:
        raise ConfigError(
            f"data.max_debates={cfg.data.max_debates} slices ArguAna's debates; a BEIR folder has none: cut the "
            "qrels files instead, or drop it"
        )
    changed = [f"data.{k}={cfg.data[k]}" for k in PAIR_KEYS if cfg.data[k] is not None] + [
        f"data.columns.{k}={v}" for k, v in cfg.data.columns.items() if v != getattr(ColumnsSchema(), k)
    ]
    if changed:
        raise ConfigError(
            f"{changed[0]} is read only from pair files, and data={cfg.data.name} is the "
            f"{'BEIR' if beir else 'ArguAna'} layout: "
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
