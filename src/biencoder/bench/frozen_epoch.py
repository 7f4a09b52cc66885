"""Item 4: one frozen real-corpus epoch of ``+experiment=frozen_arguana`` (``ln_relu``, with ``--run-overrides``
added: another head, e.g. ``model.head.hidden=[256]``), by phase.

Through the runner's own methods (:func:`biencoder.bench.epoch_phases.bench_epoch_phases`: mean of ``--epochs``
after one warm-up; ``last.pt`` at the share of epochs the runner writes it in); prints ``frozen_epoch_s:
<seconds>``. A cold embedding cache is warmed first (it says so; 4-10 min on 2 cores for the real corpus).
"""

from __future__ import annotations

import argparse

from biencoder.bench.common import Devices, corpus_found
from biencoder.bench.epoch_phases import bench_epoch_phases, print_phases


def frozen_overrides() -> list[str]:
    return ["+experiment=frozen_arguana", "+variant=ln_relu", "trainer.progress=false"]


def run(args: argparse.Namespace, devices: Devices) -> None:
    extra = "".join(f" {override}" for override in args.run_overrides)
    print(
        f"\n4. one frozen real-corpus epoch (+experiment=frozen_arguana, ln_relu{extra}; mean of {args.epochs} after "
        "a warm-up)"
    )
    if corpus_found(args.corpus):
        result = bench_epoch_phases(frozen_overrides() + list(args.run_overrides), args.epochs)
        print_phases(result)
        print(f"frozen_epoch_s: {result['phases']['epoch']:.3f}")
        print(f"frozen_epoch_cpu_s: {result['cpu']['epoch']:.3f}")
