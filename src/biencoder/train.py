"""Train one ablation cell: ``python -m biencoder.train +variant=ln_relu`` (sweep: ``-m '+variant=glob(*)'
seed=0,1,2``).

The Hydra shell over :func:`biencoder.engine.training.run.run` (what a run does, and what its folder holds, is said
there): it holds its run folder against other processes (:func:`biencoder.engine.runs.lock.claim`), decides the
runtime once, finds the run folder (rank 0's, under torchrun), and turns errors into one line and an exit code — 2 for
a config or input a person can fix (a folder another process writes among them), 3 for a diverged run (a sweep goes on
past one).
"""

from __future__ import annotations

import logging
from pathlib import Path

import hydra
from omegaconf import DictConfig

from .engine.config.selection import SELECTION_BEFORE_RECORD
from .engine.machine import distributed
from .engine.machine.runtime import nondeterministic_op
from .engine.runs.folder import discard_if_ours
from .engine.runs.lock import RunFolderBusy, claim, release, writes_run_folders
from .engine.training.epoch import Diverged
from .engine.training.run import run
from .engine.training.runner import decide_runtime
from .errors import BiencoderError
from .hydra_glue import clean_up_if_stopped, conf_dir, fail, hydra_cli, register, variant_name
from .report.run_summary import summary_text

log = logging.getLogger("biencoder")

register()


@hydra.main(version_base="1.3", config_path=conf_dir(), config_name="config")
def main(cfg: DictConfig) -> float | None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hydra_cfg = HydraConfig.get()
    out_dir = Path(hydra_cfg.runtime.output_dir)
    try:
        final = runtime = None
        if writes_run_folders():  # a resumed folder was claimed by its resolver already, before Hydra wrote into it
            claim(out_dir)
        runtime = decide_runtime(cfg)  # the one decision
        clean_up_if_stopped(False)  # the rendezvous below waits in C++: a SIGTERM must end it at once
        distributed.setup(runtime)  # the process group, only under torchrun with several processes
        shared = Path(distributed.broadcast_object(str(out_dir)))  # every rank works in rank 0's folder
        if shared != out_dir:
            discard_if_ours(out_dir)  # this rank's own (empty) Hydra folder
            out_dir = shared
        experiment = Path(hydra_cfg.sweep.dir).name if hydra_cfg.mode == RunMode.MULTIRUN else "runs"
        final = run(cfg, out_dir, experiment, runtime, variant_name(cfg))
        if final is not None:
            log.info("\n%s", summary_text(final, out_dir))
    except RunFolderBusy as err:
        fail(err)  # the folder is another process's: nothing in it is this process's to remove
    except BiencoderError as err:
        fail(err, out_dir)
    except Diverged as err:
        if hydra_cfg.mode == RunMode.MULTIRUN:  # one diverged cell must not end the sweep; final.json says it
            log.error("%s: %s", out_dir, err)
            return None
        fail(err, None, code=3)
    except RuntimeError as err:  # after Diverged (one too): an operation without a deterministic kernel
        unsupported = nondeterministic_op(err, runtime.device.type if runtime else "this device")
        if unsupported is None:
            raise
        fail(unsupported, out_dir)
    finally:
        release(out_dir)  # after this job's last log line: from here on the folder is free for another process
        distributed.teardown()
    if final is None:
        return None
    # Optuna's objective: the best val value of the metric that picked the best epoch (a resumed, finished folder
    # written before final.json recorded it picked by top1)
    return final["best"]["val"][final.get("selection", SELECTION_BEFORE_RECORD)["metric"]]


def cli() -> None:
    """The ``biencoder-train`` command (Hydra tab completion: ``eval "$(biencoder-train -sc install=bash)"``)."""
    clean_up_if_stopped(True)  # until the process group starts (main)
    hydra_cli(main)


if __name__ == "__main__":
    cli()
