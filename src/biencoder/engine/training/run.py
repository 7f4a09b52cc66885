"""One training run end to end, around the :class:`~biencoder.engine.training.runner.Runner`: validate the config once,
hold and open the run folder, set up and train, and record a failed or diverged run in ``final.json``. No Hydra here:
:func:`run` takes a plain ``DictConfig``; the ``biencoder.train`` app is its Hydra shell.
"""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig

from ...errors import BiencoderError
from ..config.heads import variant_name
from ..config.selection import selection
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
    Once the folder is opened, a crash while setting up (reading the corpus, building the model, encoding) or while
    training leaves ``final.json`` saying ``failed`` (or ``diverged``) with the error, and the exception propagates;
    trackers already open close the run as FAILED. Bad input (a :class:`~biencoder.errors.BiencoderError`) found
    while setting up is refused, not failed: it propagates with no ``final.json`` written, and the app removes what
    this process made of the folder. ``experiment``: the MLflow experiment (one per sweep). ``runtime``: the
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
    try:
        runner = Runner(cfg, folder.path, experiment, runtime, variant)  # reads the corpus first
        if runner.main:
            folder.start(cfg, runtime)
    except BiencoderError:
        raise  # bad input: refused, not failed (nothing written)
    except BaseException as err:
        if distributed.is_main():
            folder.record("failed", **_run_fields(cfg, variant_name(cfg, variant)), error=_error(err))
        raise
    try:
        return runner.fit(state)
    except Diverged as err:
        fields = {"epoch": err.epoch, "what": err.what, "loss_parts": err.parts, "error": str(err)}
        _record_end(folder, runner, cfg, "diverged", **fields)
        raise
    except BaseException as err:
        _record_end(folder, runner, cfg, "failed", error=_error(err))
        raise


def _record_end(folder: RunFolder, runner: Runner, cfg: DictConfig, status: str, **fields) -> None:
    """On rank 0: ``final.json`` says how the run ended (``status`` with ``fields``), and the trackers are told."""
    if runner.main:
        folder.record(status, **_run_fields(cfg, runner.variant), **fields)
        runner.tracker.finish({}, status)


def _run_fields(cfg: DictConfig, variant: str) -> dict:
    """What every ``final.json`` of a run that did not finish says of the run: its cell, seed and selection rule."""
    return {
        "variant": variant,
        "seed": int(cfg.seed),
        "selection": selection(cfg.loss.ce_weight, cfg.eval.select, cfg.data.layout),
    }


def _error(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"
