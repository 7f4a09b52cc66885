"""Item 7 (CUDA; only with ``--items sweep``): the 20-run fine-tuning ablation on ``data=arguana`` as a real Hydra
multirun with ``--jobs`` concurrent jobs; prints ``ablation_wall_s: <seconds> (jobs N)`` per job count."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from biencoder.bench.common import SRC, Devices, corpus_found


def sweep_command(jobs: int, log_dir: Path, extra: list[str]) -> tuple[list[str], dict[str, str]]:
    """The 20-run ablation (4 cells x 5 seeds, data=arguana, defaults otherwise) as a Hydra multirun of ``jobs``
    concurrent jobs on this machine (hydra/launcher=parallel), and its environment (one CPU thread share per job)."""
    command = [
        sys.executable,
        "-m",
        "biencoder.train",
        "-m",
        "hydra/launcher=parallel",
        "data=arguana",
        "+variant=glob(*)",
        "seed=0,1,2,3,4",
        "trainer.progress=false",
        f"paths.log_dir={log_dir}",
        *extra,
    ]
    threads = max(1, (os.cpu_count() or 1) // jobs)
    env = {
        **os.environ,
        "BIENCODER_JOBS": str(jobs),
        "OMP_NUM_THREADS": str(threads),
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    return command, env


def bench_sweep(jobs: int, extra: list[str], keep: Path | None = None) -> float:
    """Wall seconds of :func:`sweep_command`. Its run folders go to ``keep`` (kept: the runs of a measured sweep are
    results too), else to a temporary folder, removed after."""
    log_dir = keep if keep is not None else Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    try:
        command, env = sweep_command(jobs, log_dir, extra)
        start = time.perf_counter()
        subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
        return time.perf_counter() - start
    finally:
        if keep is None:
            shutil.rmtree(log_dir, ignore_errors=True)  # the temporary folder this function made


def run(args: argparse.Namespace, devices: Devices) -> None:
    extra = list(args.run_overrides)
    shown = f"; {' '.join(extra)}" if extra else ""
    print(
        f"\n7. the 20-run fine-tuning ablation (data=arguana, 4 cells x 5 seeds, defaults{shown}; "
        "hydra/launcher=parallel)"
    )
    if not devices.cuda:
        print("   skipped (no CUDA device: 20 fine-tuning runs take days on a CPU)")
    elif corpus_found(args.corpus):
        for jobs in args.jobs:
            keep = None if args.keep is None else args.keep / f"jobs{jobs}"
            print(f"ablation_wall_s: {bench_sweep(jobs, extra, keep):.1f} (jobs {jobs})")
            if keep is not None:
                print(f"   run folders kept in {keep}")
