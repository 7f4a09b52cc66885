"""One training run end to end, around the :class:`~biencoder.engine.training.runner.Runner`: validate the config once,
hold and open the run folder, train, and record a failed or diverged run in ``final.json``. No Hydra here: :func:`run`
takes a plain ``DictConfig``; the ``biencoder.train`` app is its Hydra shell.
"""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig

from ..config.validation import validate
from ..machine import distributed
from ..machine.runtime import Runtime
from ..runs.folder import RunFolder
from ..runs.lock import claim, release
from ..runs.tracking import check_packages
from .epoch import Diverged
from .runner import Runner, start_up

log = logging.getLogger("biencoder")


def run(
    cfg: DictConfig,
    out_dir: Path,
    experiment: str = "runs",
    runtime: Runtime | None = None,
    variant: str | None = None,
) -> dict | None:
    """Train one cell into ``out_dir`` (or continue it, with ``trainer.resume``); returns what ``final.json`` holds.

    A finished folder (status ``done``) is left as it is when resuming, so a re-run sweep skips its done jobs.
    On a crash ``final.json`` says ``failed`` (or ``diverged``) with the error, the trackers close the run as
    FAILED, and the exception propagates. ``experiment``: the MLflow experiment (one per sweep). ``runtime``: the
    start-up decision (:func:`~.runner.start_up`; made here when None). ``variant``: the cell's name (see
    :class:`Runner`). Rank 0 holds ``out_dir`` for the run (:func:`~biencoder.engine.runs.folder.claim`, unless this
    process holds it already):
    :class:`~biencoder.engine.runs.folder.RunFolderBusy`, with nothing changed, when another process does.
    """
    validate(cfg)  # once per run, before the folder is touched (the runner trusts it)
    check_packages(cfg)
    runtime = start_up(cfg) if runtime is None else runtime
    folder = RunFolder(out_dir)
    took = distributed.is_main() and claim(folder.path)
    try:
        return _run_held(cfg, folder, experiment, runtime, variant)
    finally:
        if took:
            release(folder.path)


def _run_held(
    cfg: DictConfig, folder: RunFolder, experiment: str, runtime: Runtime, variant: str | None
) -> dict | None:
    """:func:`run` in a folder this process holds (rank 0; the others work in it through rank 0)."""
    if not distributed.is_main():
        log.setLevel(logging.WARNING)  # rank 0 speaks for the run
    done = folder.open(cfg, main=distributed.is_main(), runtime=runtime)
    if done is not None:
        return done
    state = folder.load_state()  # an unreadable last.pt is refused here, before anything in the folder changes
    runner = Runner(cfg, folder.path, experiment, runtime, variant)  # reads the corpus first
    if runner.main:
        folder.start(cfg, runtime)
    try:
        return runner.fit(state)
    except Diverged as err:
        _record_end(folder, runner, "diverged", epoch=err.epoch, what=err.what, loss_parts=err.parts, error=str(err))
        raise
    except BaseException as err:
        _record_end(folder, runner, "failed", error=f"{type(err).__name__}: {err}")
        raise


def _record_end(folder: RunFolder, runner: Runner, status: str, **fields) -> None:
    """On rank 0: ``final.json`` says how the run ended (``status`` with ``fields``), and the trackers are told."""
    if runner.main:
        folder.record(status, variant=runner.variant, seed=int(runner.cfg.seed), selection=runner.selection, **fields)
        runner.tracker.finish({}, status)
