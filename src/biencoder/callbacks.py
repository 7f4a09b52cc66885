"""Hydra callbacks (``hydra.callbacks`` in ``conf/hydra/default.yaml``)."""

from __future__ import annotations

from pathlib import Path

from hydra.experimental.callback import Callback


class SweepSummary(Callback):
    """At the end of a ``-m`` sweep: its folder, the table of its cells, and the command that makes it again."""

    def on_multirun_end(self, config, **kwargs) -> None:
        from .summary import main

        sweep = Path(config.hydra.sweep.dir)
        print(f"\n== sweep finished: {sweep}", flush=True)
        if any(sweep.rglob("final.json")):
            main([str(sweep), "--n-boot", "2000"])
        print(f"compare again (other options: --internals, --x KEY, --reference ...): "
              f"python scripts/plot_top1.py {sweep}", flush=True)
