"""Everything Hydra: the ConfigStore schema and the resolvers, the apps' config folder, and one line (exit 2) for
every error Hydra or the apps raise on bad input.

The only module of the package that imports Hydra besides the ``@hydra.main`` apps (``train``, ``evaluate``); the
engine below it stays usable from Python with a plain config object.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from .engine.config import heads
from .engine.config.keys import unknown_key_message
from .engine.config.packaged import register_resolvers
from .engine.config.schema import LOSS_OPTIONS, Schema
from .engine.config.settings import flatten
from .engine.data.arguana import arguana_root
from .engine.runs.folder import discard_if_ours, new_dir_resolver, run_dir_resolver
from .engine.runs.lock import claim, writes_run_folders
from .errors import BiencoderError, report


def _variant_resolver(*, _root_: DictConfig) -> str:
    """``${variant_name:}``: the run's variant (:func:`~biencoder.engine.config.heads.variant_name`) as the folder
    names it, with the ``+variant=`` choice of the config being composed."""
    return heads.variant_name(_root_, OmegaConf.select(_root_, "hydra.runtime.choices.variant", default=None))


def variant_name(cfg: DictConfig) -> str:
    """The run's variant (:func:`~biencoder.engine.config.heads.variant_name`), with the ``+variant=`` choice of the
    running Hydra app, if any."""
    choice = HydraConfig.get().runtime.choices.get("variant") if HydraConfig.initialized() else None
    return heads.variant_name(cfg, choice)


def job_dir_resolver(subdir: str, *, _root_: DictConfig) -> str:
    """``hydra.sweep.subdir``: returned unchanged; notes whether ``<sweep dir>/<subdir>`` existed before the job, and
    claims it if it did (a resumed sweep's job, before Hydra writes into it)."""
    path = new_dir_resolver(os.path.join(str(OmegaConf.select(_root_, "hydra.sweep.dir")), subdir))
    if os.path.isdir(path) and writes_run_folders():
        claim(path)
    return subdir


def hydra_subdir_resolver(*, _root_: DictConfig) -> str | None:
    """``hydra.output_subdir``: ``.hydra``, or None (Hydra writes nothing) when the job's folder already holds one:
    a resumed run keeps the record of how it was started, and a refused resume leaves its folder as it was."""
    output_dir = OmegaConf.select(_root_, "hydra.runtime.output_dir", default=None)
    if output_dir and (Path(output_dir) / ".hydra").is_dir():
        return None
    return ".hydra"


def register() -> None:
    """The schema (ConfigStore ``biencoder_schema``), the options of the ``loss`` group (``loss/triplet_ce``,
    ``loss/infonce``) and the resolvers ``${minilm_path:}``, ``${demo_root:}``, ``${variant_name:}``,
    ``${arguana_root:}``, ``${run_dir:...}``, ``${job_dir:...}``, ``${new_dir:...}``; safe to call more than once."""
    store = ConfigStore.instance()
    # the loss group fills `loss` with one option's dataclass, so composition refuses a key of another loss; the
    # schema leaves the node to it (an option merges only into a missing node, not into another option)
    store.store(name="biencoder_schema", node=Schema(loss=MISSING))
    for name, option in LOSS_OPTIONS.items():
        store.store(group="loss", name=name, node=option)
    register_resolvers()  # minilm_path, demo_root: the schema's own
    OmegaConf.register_new_resolver("arguana_root", lambda: str(arguana_root()), replace=True)
    OmegaConf.register_new_resolver("variant_name", _variant_resolver, replace=True)
    OmegaConf.register_new_resolver("run_dir", run_dir_resolver, replace=True)
    OmegaConf.register_new_resolver("job_dir", job_dir_resolver, replace=True)
    OmegaConf.register_new_resolver("new_dir", new_dir_resolver, replace=True)
    OmegaConf.register_new_resolver("hydra_subdir", hydra_subdir_resolver, replace=True)


def compose_config(
    overrides=(), config_name: str = "config", config_dir: str | Path | None = None, hydra_config: bool = False
) -> DictConfig:
    """The configs of ``conf/`` (or of ``config_dir``) composed with ``overrides`` as the apps compose them, without
    a run folder: the schema, the loss options and the resolvers registered first. ``hydra_config``: with the
    ``hydra`` node (launcher, sweeper). Not validated (:func:`biencoder.engine.config.validation.validate`)."""
    register()
    with initialize_config_dir(config_dir=str(config_dir or conf_dir()), version_base="1.3"):
        return compose(config_name=config_name, overrides=list(overrides), return_hydra_config=hydra_config)


#: what Hydra writes into a job's folder besides ``<job name>.log`` (``hydra.output_subdir``)
HYDRA_FILES = (".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml")


def job_files() -> tuple[str, ...]:
    """The files Hydra wrote into this job's folder: :data:`HYDRA_FILES` and ``<job name>.log``."""
    job = HydraConfig.get().job.name if HydraConfig.initialized() else None
    return HYDRA_FILES + ((f"{job}.log",) if job else ())


def fail(err: Exception, out_dir: Path | None = None, code: int = 2) -> None:
    """Bad input: one line on stderr, exit ``code``. What this process made of ``out_dir`` is removed
    (:func:`biencoder.engine.runs.folder.discard_if_ours`: the folder if it created it, else only Hydra's files of this
    job); anything else is left exactly as it was."""
    if _torchrun_worker():  # torchrun's SIGTERM (another rank failed too) must not cut this short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    report(err, code)
    if out_dir is not None:
        discard_if_ours(out_dir, job_files())
    sys.exit(code)


def _torchrun_worker() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and threading.current_thread() is threading.main_thread()


def _stopped(signum, frame) -> None:
    """SIGTERM before the run started: remove what this process made of its Hydra folder (as :func:`fail` does), then
    die of the signal, as without this handler."""
    if HydraConfig.initialized():  # Hydra names the folder before it makes it
        discard_if_ours(Path(HydraConfig.get().runtime.output_dir), job_files())
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def clean_up_if_stopped(on: bool) -> None:
    """Under torchrun (``WORLD_SIZE`` > 1): while ``on``, a SIGTERM removes what this process made of its Hydra folder
    before it ends the process. torchrun stops every other rank as soon as one fails (more processes than GPUs: every
    rank finds it at start-up), and a rank stopped before its own error would otherwise leave its Hydra folder behind.
    On from ``biencoder-train``'s start until its process group starts: a Python handler cannot run while the main
    thread waits in torch's rendezvous, so from there on SIGTERM ends the process at once."""
    if _torchrun_worker():
        signal.signal(signal.SIGTERM, _stopped if on else signal.SIG_DFL)


#: lines of Hydra's multi-line messages that tell the user what to type instead: kept in the one line
_HINT = re.compile(r"^(\d\.\s*)?(To append|To use it|To sweep|To override|add --multirun|Use \+|use \+)", re.I)


def _in_chain(err: BaseException, kind: type) -> BaseException | None:
    """The first exception of type ``kind`` in ``err``'s cause chain, or None: our error (ConfigError,
    RunFolderError, ...) raised inside a resolver, or the OSError that logging.config wraps in a ValueError."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, kind):
            return err
        err = err.__cause__ or err.__context__
    return None


def _one_line(err: BaseException) -> str:
    """Hydra/OmegaConf composition errors span several lines; the first line of each, Hydra's hints (``use
    +variant=ln``, ``add --multirun``) and the options offered."""
    ours = _in_chain(err, BiencoderError)
    if ours is not None:
        return str(ours)
    text = str(err).strip()
    refused = re.match(r"Could not override '([\w.]+)'", text)
    # a key the schema or the chosen loss lacks: our line (with the closest key), not Hydra's hint to add it with +
    if refused and isinstance(err.__cause__, (ConfigAttributeError, ConfigKeyError)):
        message = unknown_key_message(refused.group(1), _loss_of(err.__cause__.object_type_str))
        if message:
            return message
    # ... or one a config file sets: the same line, after the file's name
    in_file = re.match(r"(In '[^']+'): Config(?:Key|Attribute)Error raised while composing config:", text)
    key, owner = re.search(r"full_key: ([\w.]+)", text), re.search(r"object_type=(\w+)", text)
    if in_file and key:
        message = unknown_key_message(key.group(1), _loss_of(owner.group(1) if owner else None))
        if message:
            return f"{in_file.group(1)}: {message}"
    lines = text.splitlines()
    first = lines[0] if text else type(err).__name__
    hints = [_HINT.sub(lambda m: m.group(2), line.strip()) for line in lines[1:] if _HINT.match(line.strip())]
    if hints:
        first += " (" + "; ".join(h[0].lower() + h[1:] for h in hints) + ")"
    if "Available options in" in text:
        listed = text.split("Available options in", 1)[1].splitlines()[1:]
        options = [
            line.strip()
            for line in listed[: next((i for i, line in enumerate(listed) if not line.startswith("\t")), len(listed))]
        ]
        first += f" (available: {', '.join(options)})"
    cause = err.__cause__
    if cause is not None and str(cause).strip():
        cause_text = str(cause).strip().splitlines()
        key = next(
            (line.split(":", 1)[1].strip() for line in cause_text if line.strip().startswith("full_key:")), None
        )
        first += f": {cause_text[0]}" + (f" (key {key})" if key and key not in cause_text[0] else "")
    return first


def _loss_of(object_type: str | None) -> str | None:
    """The loss whose option (a dataclass of :data:`LOSS_OPTIONS`) is named ``object_type``, or None."""
    return next((name for name, option in LOSS_OPTIONS.items() if option.__name__ == object_type), None)


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


def note_run_dir(argv: list[str]) -> None:
    """A ``hydra.run.dir=<path>`` or ``hydra.sweep.dir=<path>`` override replaces the resolver that notes whether the
    folder existed: note it here, before Hydra creates it, so that an error removes only what this process made."""
    for arg in argv:
        key, _, value = arg.lstrip("+").partition("=")
        if len(value) > 1 and value[0] == value[-1] and value[0] in "'\"":  # Hydra's quoting: 'a b' is a b
            value = value[1:-1]
        if key in ("hydra.run.dir", "hydra.sweep.dir") and value and "${" not in value:
            new_dir_resolver(value)


def hydra_cli(app) -> None:
    """Run a ``@hydra.main`` app so that a bad override, config file or output folder costs one line and exit 2.

    Hydra prints composition errors over several lines; here they are caught and shortened. With
    ``HYDRA_FULL_ERROR=1`` set by the user every error propagates with its full traceback, as Hydra does.
    """
    note_run_dir(sys.argv[1:])
    # -m after an override ("model=tiny -m seed=0,1") is a usage error in argparse, which takes the overrides as one
    # list of positionals; the flag means the same anywhere, so it goes first
    multirun = [arg for arg in sys.argv[1:] if arg in ("-m", "--multirun")]
    sys.argv[1:] = multirun + [arg for arg in sys.argv[1:] if arg not in multirun]
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
        line = _value_error_line(err)
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        sys.exit(2)
    except BrokenPipeError:  # `... --help | head`: the reader left; nothing went wrong here
        sys.stderr.close()
        sys.exit(0)
    except OSError as err:  # e.g. an output folder that cannot be created, a full disk
        print(
            f"error: {err.strerror or err}: '{err.filename}': check that paths.log_dir (or hydra.run.dir) "
            "is a writable folder and that the disk has space",
            file=sys.stderr,
        )
        sys.exit(2)


def _value_error_line(err: ValueError) -> str | None:
    """The one line for a ValueError Hydra lets through: an unwritable log file, or a flag that cannot go with -m;
    None for any other (a bug: it propagates)."""
    unwritable = _in_chain(err, OSError) if "Unable to configure handler" in str(err) else None
    if unwritable is not None:  # logging's file handler in the job's folder: a read-only or missing folder
        reason = unwritable.strerror or unwritable
        return (
            f"cannot write the log file {unwritable.filename or ''} ({reason}): hydra.run.dir (or "
            "paths.log_dir, or the trainer.resume folder) must be a writable folder"
        )
    if "can be specified" not in str(err):  # Hydra's "Only one of --run, --multirun, --cfg ..." and nothing else
        return None
    return (
        f"{err}: to see a sweep job's config, drop -m and pass that job's values (e.g. +variant=ln seed=0 --cfg job)"
    )
