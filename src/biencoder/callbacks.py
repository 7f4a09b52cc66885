"""Hydra callbacks (``hydra.callbacks`` in ``conf/hydra/default.yaml``)."""

from __future__ import annotations

import sys
from pathlib import Path

from hydra.experimental.callback import Callback

from .errors import ConfigError, report


def _ran_jobs(sweep: Path) -> bool:
    """Whether this process's sweep ran a job: every job writes in its own subfolder (a resumed, finished one at
    least its log), so a file below a subfolder is newer than the process."""
    from .engine.runs.folder import PROCESS_START

    return sweep.is_dir() and any(
        file.stat().st_mtime >= PROCESS_START
        for sub in sweep.iterdir()
        if sub.is_dir()
        for file in sub.rglob("*")
        if file.is_file()
    )


class SweepSummary(Callback):
    """At the end of a ``-m`` sweep: its folder, the table of its cells, and the command that makes it again."""

    def on_multirun_end(self, config, **kwargs) -> None:
        from .summary import main

        sweep = Path(config.hydra.sweep.dir)
        if not _ran_jobs(sweep):
            from .engine.runs.folder import discard_if_ours

            discard_if_ours(sweep)  # only a folder this process made (it holds Hydra's multirun.yaml, nothing else)
            # an exit, not an exception: Hydra turns a callback's exceptions into warnings
            sys.exit(
                report(
                    ConfigError(
                        "the sweep launched 0 jobs: a list or glob() in the overrides matched no "
                        "option (a group's options are its files, e.g. conf/variant/*.yaml for "
                        "+variant=glob(*))"
                    )
                )
            )
        print(f"\n== sweep finished: {sweep}", flush=True)
        if any(sweep.rglob("final.json")):
            main([str(sweep)])  # the same settings as plot_top1.py, so both print the same p-values and verdicts
        # the installed command and an absolute folder: the line works from any directory, unlike the repository's
        # scripts/plot_top1.py
        print(
            f"compare again (other options: --internals, --x KEY, --reference ..., --factors ...): "
            f"biencoder-plot {sweep.resolve()}",
            flush=True,
        )
