"""The life of a run folder: create or resume it, checkpoint into it, finish it, and clean up after an error.

Rules this module enforces (each has a test in ``tests/engine/runs/test_rundir.py``):

* **Nothing this process did not create is ever deleted.** Hydra makes the output folder before the app runs, so
  the run-dir resolvers (``${run_dir:...}`` for ``hydra.run.dir``, ``${job_dir:...}`` for a sweep job,
  ``${new_dir:...}`` for a sweep's folder and other apps' folders) note whether the folder already existed when Hydra
  resolved its path, which is before Hydra creates it (a ``hydra.run.dir=`` or ``hydra.sweep.dir=`` given on the
  command line is noted before Hydra starts). On a bad-input error a folder is removed only if it did not exist then,
  every file in it was written after this process started, and it holds no metrics (a run that trained is never
  removed); the empty parent folders this process made for it go too. In a folder that did exist, only the files
  Hydra writes for the job (``.hydra/*.yaml``, the job's log) are removed, when they lie inside it (no symlink on the
  way), were not there before and were written since this process started: nothing else there, whoever made it, is
  touched. A sweep that ran no job removes its folder on the same terms (made by this process, every file in it
  newer). (Two commands started at once into the same new folder are not told apart.)
* **``trainer.resume=<path>`` names a run folder of this tool** (it holds ``config_resolved.yaml``, ``last.pt`` or
  ``final.json``). Anything else is refused by the resolver, before Hydra writes into it.
* **A resumed run is the same run**: every setting but :data:`~biencoder.engine.config.settings.NON_RESULT_KEYS` must
  equal the saved one, checked before anything else (a finished run with other settings is refused, not skipped), and
  it continues on the same device type with the same precision (``config_resolved.yaml`` records both resolved).
* **``last.pt`` is written off the training path, and whole** (``tests/engine/runs/test_background_write.py``):
  :meth:`RunFolder.save_state` returns once the state is copied (the write goes on in a thread, one at a time, as a
  temp file renamed over ``last.pt``), so a kill at any point leaves the previous ``last.pt`` or the new one;
  :meth:`RunFolder.finish` (and a run that fails) waits for the write before anything that vouches for it, and a
  failed write's error is raised in the caller's thread.
* **One process writes a run folder at a time**: :mod:`.lock` (:func:`~.lock.claim`, :func:`~.lock.release`); the
  bad-input clean-up below removes ``run.lock`` only when this process created it and holds it.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from ...errors import ConfigError
from ..config.settings import is_non_result_key, resume_folder, resume_requested, run_settings
from ..data.pair_records import data_files
from ..files import BackgroundWriter, save_atomic, save_npy_atomic, write_json_atomic, write_text_atomic
from ..machine.runtime import Runtime
from .lock import announce_lock, claim, created_lock, own_lock_file, release, writes_run_folders
from .records import RunFolderError, append_rows, is_done, read_final, truncate_metrics

log = logging.getLogger("biencoder")

#: wall-clock time this module was imported: every file this process writes is newer (less a little slack for
#: file systems that store coarse times)
PROCESS_START = time.time() - 2.0
#: absolute folder path -> whether it existed when its path was first resolved (before Hydra created it)
_EXISTED: dict[str, bool] = {}
#: absolute folder path -> the names in it then, for a folder that existed
_ENTRIES: dict[str, frozenset[str]] = {}
#: absolute folder path -> its outermost ancestor that did not exist either, for a folder that did not exist
_FIRST_NEW: dict[str, str] = {}
#: what makes a folder a run folder of this tool
RUN_MARKERS = ("config_resolved.yaml", "last.pt", "final.json")


def new_dir_resolver(path: str | Path) -> str:
    """``${new_dir:<path>}``: ``path`` unchanged; notes whether it existed before this process resolved it."""
    key = os.path.abspath(str(path))
    if key not in _EXISTED:
        _EXISTED[key] = os.path.exists(key)
        if os.path.isdir(key):
            _ENTRIES[key] = frozenset(os.listdir(key))
        elif not _EXISTED[key]:
            first = key
            while not os.path.exists(os.path.dirname(first)):
                first = os.path.dirname(first)
            _FIRST_NEW[key] = first
    return str(path)


def created_by_this_process(path: str | Path) -> bool:
    """True only for a folder whose path was resolved by this process while it did not exist yet."""
    return _EXISTED.get(os.path.abspath(str(path))) is False


def is_run_folder(path: str | Path) -> bool:
    return Path(path).is_dir() and any((Path(path) / name).is_file() for name in RUN_MARKERS)


def check_resume_target(path: str | Path) -> Path:
    """The folder of ``trainer.resume=<path>``, or :class:`RunFolderError` if it is not a run folder of this tool."""
    folder = Path(path).expanduser()
    if not is_run_folder(folder):
        what = "does not exist" if not folder.exists() else "is not a run folder of biencoder.train"
        raise RunFolderError(
            f"trainer.resume='{path}' {what}: pass a folder that holds {' or '.join(RUN_MARKERS)} "
            "(logs/runs/<time>_<variant>_s<seed>), or trainer.resume=true to continue a sweep's jobs"
        )
    return folder


def run_dir_resolver(resume: Any, default: str) -> str:
    """``hydra.run.dir``: the folder named by ``trainer.resume=<run dir>`` (checked), else ``default`` (new)."""
    folder = resume_folder(resume)
    if folder is not None:  # the folder checked, ~ expanded (a quoted '~/run' is no folder named ~ here)
        path = new_dir_resolver(str(check_resume_target(folder)))
        if writes_run_folders():
            claim(path)  # before Hydra opens its log or writes .hydra/ there
        return path
    return new_dir_resolver(default)


def recorded_config(cfg: DictConfig, runtime: Runtime | None) -> dict:
    """``cfg`` with every interpolation resolved, as ``config_resolved.yaml`` records it: ``trainer.device`` and
    ``trainer.precision`` as the runtime resolved them (``cpu``/``cuda``, ``fp32``/``bf16``; never ``auto``),
    ``eval.pair_batch_size`` as used (null: the device's), and
    ``runtime``: the record of the process (device name, precision, determinism, processes). The precision is thus
    a setting summaries group by; ``runtime.`` is a non-result prefix. Pair files add ``data_files``: path, bytes
    and sha256 of each (:func:`biencoder.engine.data.pair_records.data_files`), so a run resumed, or a cell
    summarised, on other contents of a file is refused or kept apart (the sha256 is a result key; the path is
    not)."""
    config = OmegaConf.to_container(cfg, resolve=True)
    files = data_files(cfg.data)
    if files:
        config["data_files"] = files
    if runtime is not None:
        config["trainer"].update(device=runtime.device.type, precision=runtime.precision)
        config["eval"]["pair_batch_size"] = runtime.pair_batch_size(config["eval"]["pair_batch_size"])
        config["runtime"] = runtime.record()
    return config


def discard_if_ours(path: str | Path, job_files: tuple[str, ...] = ()) -> bool:
    """Remove what this process made of ``path`` after a bad-input error; returns whether anything was removed.

    A folder this process created goes, with the empty parents it created for it, if every file in it was written by
    this process and nothing was trained into it. In a folder that existed, only the files named by ``job_files``
    (relative paths: what Hydra writes for the job) go, each only if its first part was not in the folder before and
    it was written since this process started; then their folders if empty. Nothing else is touched."""
    folder, key = Path(path), os.path.abspath(str(path))
    metrics = folder / "metrics.jsonl"
    if not folder.is_dir() or metrics.exists() and metrics.stat().st_mtime >= PROCESS_START:
        return False  # this process trained into it
    if created_by_this_process(folder):
        files = [p for p in folder.rglob("*") if not p.is_dir() or p.is_symlink()]
        if any(p.is_symlink() or p.lstat().st_mtime < PROCESS_START for p in files):
            return False
        _close_logs(folder)
        shutil.rmtree(folder, ignore_errors=True)
        release(folder)
        _remove_empty(os.path.dirname(key), _FIRST_NEW.get(key))
        return True
    if key not in _ENTRIES:
        return False
    mine = [folder / name for name in job_files if _inside(folder, name) and Path(name).parts[0] not in _ENTRIES[key]]
    mine = [p for p in mine if p.is_file() and p.lstat().st_mtime >= PROCESS_START]
    created, lock_file = created_lock(folder), own_lock_file(folder)
    if lock_file is not None:
        mine.append(lock_file)  # created by this process, removed while held (a claim checks it is the same file)
    if mine:
        _close_logs(folder)
    for file in mine:
        file.unlink()
        if file.parent != folder:
            _remove_empty(str(file.parent), str(file.parent))
    if created:
        release(folder)
    return bool(mine)


def _inside(folder: Path, name: str) -> bool:
    """Whether ``folder / name`` is a path below ``folder`` with no symlink on the way (``name`` relative, no ..)."""
    relative = Path(name)
    if relative.is_absolute() or ".." in relative.parts or not relative.parts:
        return False
    return os.path.realpath(folder / relative) == os.path.join(os.path.realpath(folder), *relative.parts)


def _close_logs(folder: Path) -> None:
    """Close and detach our log handlers that write below ``folder`` (before their files are removed)."""
    for logger in (logging.getLogger(), log):
        for handler in list(logger.handlers):
            if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename).resolve().is_relative_to(
                folder.resolve()
            ):
                handler.close()
                logger.removeHandler(handler)


def _remove_empty(path: str, outermost: str | None) -> None:
    """Remove ``path`` and its parents up to ``outermost`` (absolute paths) while each is empty (``os.rmdir``
    removes nothing else)."""
    if outermost is None:
        return
    while path == outermost or path.startswith(outermost + os.sep):
        try:
            os.rmdir(path)
        except OSError:
            return
        path = os.path.dirname(path)


class RunFolder:
    """One run's folder and the files in it (see the README's "Where results go").

    ``metrics.jsonl`` (appended, fsynced per epoch), ``config_resolved.yaml``, ``last.pt`` (full training state),
    ``best.pt`` (best-by-val weights + what is needed to use them), ``test_hits.npy``, ``test.run.gz`` and
    ``test.qrels`` (:mod:`.trec`), ``final.json``, ``train.log``.
    :attr:`last_writer` (a :class:`~biencoder.engine.files.BackgroundWriter`) writes ``last.pt`` for
    :meth:`save_state`; its ``wait()`` and :meth:`finish` wait for this object's writes, not another's.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.metrics = self.path / "metrics.jsonl"
        self.last = self.path / "last.pt"
        self.final = self.path / "final.json"
        self.config = self.path / "config_resolved.yaml"
        self.last_writer = BackgroundWriter(self.last)

    # -- opening ------------------------------------------------------------------------------------------------
    def open(self, cfg: DictConfig, main: bool = True, runtime: Runtime | None = None) -> dict | None:
        """Make the folder ready for ``cfg``. Returns the saved ``final.json`` when the run is done already and
        ``trainer.resume`` asks to continue it (a re-run sweep skips it); None when training should go on.

        Raises :class:`ConfigError` when a resume changes a setting that changes results (checked first, so a
        finished run is never silently "resumed" with other settings), or when the folder holds a run and
        ``trainer.resume`` is off. ``runtime``: this process's decision (device type and precision must match).
        """
        self.path.mkdir(parents=True, exist_ok=True)
        if main:
            self.attach_log()
            announce_lock(self.path)
        resuming = resume_requested(cfg.trainer.resume)
        if resuming:
            self.check_same_config(cfg, runtime)
            if is_done(self.path):
                log.info("%s is already done (final.json status done): skipping it", self.path)
                return read_final(self.path)
        elif main and self.metrics.exists():
            raise ConfigError(
                f"{self.path} already holds a run: pass trainer.resume=true to continue it, "
                "or choose another output folder"
            )
        return None

    def start(self, cfg: DictConfig, runtime: Runtime | None = None) -> None:
        """A (re)started attempt: the old verdict no longer holds; save the config with every value resolved."""
        self.final.unlink(missing_ok=True)
        # .hydra/config.yaml keeps interpolations (${minilm_path:}, ${oc.env:...}); this copy says what was used
        OmegaConf.save(OmegaConf.create(recorded_config(cfg, runtime)), self.config)

    def check_same_config(self, cfg: DictConfig, runtime: Runtime | None = None) -> None:
        """A resumed run must be the same run: every setting but the non-result ones as saved, on the same device
        type with the same precision (a run recorded before they were resolved, ``auto``, is not checked on them)."""
        if not self.config.exists():
            return
        saved_config = OmegaConf.to_container(OmegaConf.load(self.config), resolve=True)
        now_config = recorded_config(cfg, runtime)
        ran_on = saved_config.get("trainer", {}).get("device")
        if runtime is not None and ran_on in ("cpu", "cuda") and ran_on != runtime.device.type:
            raise ConfigError(
                f"cannot resume {self.path}: it ran on {ran_on}, and this process would continue it on "
                f"{runtime.device.type}; resume it where trainer.device={ran_on} works, or start a new "
                "run without trainer.resume"
            )

        def flat(config):
            return {k: v for k, v in run_settings(config).items() if not is_non_result_key(k)}

        saved, now = flat(saved_config), flat(now_config)
        if saved.get("trainer.precision") == "auto":  # recorded before the precision was resolved: unknown
            now["trainer.precision"] = "auto"
        changed = sorted(k for k in saved.keys() | now.keys() if saved.get(k) != now.get(k))
        if changed:
            shown = ", ".join(f"{k}: {saved.get(k)!r} -> {now.get(k)!r}" for k in changed[:3])
            raise ConfigError(
                f"cannot resume {self.path}: it was started with other settings ({shown}); "
                "resume with the original overrides, or start a new run without trainer.resume"
            )

    def attach_log(self) -> None:
        target = (self.path / "train.log").resolve()
        handlers = logging.getLogger().handlers + log.handlers
        if not any(isinstance(h, logging.FileHandler) and Path(h.baseFilename) == target for h in handlers):
            handler = logging.FileHandler(target)
            handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
            log.addHandler(handler)
            log.setLevel(logging.INFO)

    # -- during the run -----------------------------------------------------------------------------------------
    def append(self, rows: list[dict]) -> None:
        append_rows(self.metrics, rows)

    def truncate(self, last_epoch: int) -> int:
        """Drop metric rows after ``last_epoch`` (an epoch logged but not checkpointed); returns how many.

        ``last_epoch`` -1 (no ``last.pt``: the run starts over) drops every row, and says so in a warning with the
        count, since those rows are the only record of the epochs the run already went through."""
        dropped = truncate_metrics(self.metrics, last_epoch)
        if last_epoch < 0 and dropped:
            log.warning("%s: no last.pt: %d rows of metrics.jsonl dropped, starting over", self.path, dropped)
        return dropped

    def save_state(self, state: dict) -> None:
        """``state`` (:func:`~biencoder.engine.runs.checkpoint.training_state`) into ``last.pt`` by
        :attr:`last_writer`: returns once it is copied (the caller may then change any tensor of it); the write goes
        on in a thread."""
        self.last_writer.submit(state)

    def load_state(self) -> dict | None:
        """``last.pt``, or None when there is none; :class:`RunFolderError` when it cannot be read."""
        if not self.last.exists():
            return None
        try:
            return torch.load(self.last, map_location="cpu", weights_only=True)
        except Exception as err:  # noqa: BLE001 - any unreadable file gets the same advice
            raise RunFolderError(
                f"cannot resume from {self.last} ({type(err).__name__}): the checkpoint is corrupt; "
                "delete it to start the run again"
            ) from None

    # -- ending -------------------------------------------------------------------------------------------------
    def finish(
        self,
        final: dict,
        arrays: dict[str, np.ndarray],
        checkpoint: dict | None,
        keep_last: bool,
        texts: dict[str, str] | None = None,
    ) -> None:
        """Wait for the ``last.pt`` write in flight (raising its error; the writer lets go of its memory), then
        ``<name>.npy`` per array (test_hits, test_seen), each text file of ``texts`` (name → content: ``test.run.gz``,
        ``test.qrels``) and ``best.pt``, then ``final.json`` (status done), so it vouches for the rest; then
        ``last.pt`` goes unless ``keep_last``. Every file is written atomically."""
        self.last_writer.close()
        for name, array in arrays.items():
            save_npy_atomic(self.path / f"{name}.npy", array)
        for name, text in (texts or {}).items():
            write_text_atomic(self.path / name, text)
        if checkpoint is not None:
            save_atomic(checkpoint, self.path / "best.pt")
        write_json_atomic(self.final, final)
        if not keep_last:
            self.last.unlink(missing_ok=True)

    def record(self, status: str, **fields) -> None:
        """``final.json`` for a run that ended without finishing: status ``failed`` or ``diverged``."""
        write_json_atomic(self.final, {"status": status, **fields})
