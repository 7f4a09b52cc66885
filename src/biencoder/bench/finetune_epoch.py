"""Item 6: one fine-tuning epoch by phase (tokenise, mine, train, encode and retrieve + rerank per split, log,
checkpoint): the default run on ``data=arguana`` on CUDA, the tiny model on the demo corpus on a CPU; prints
``finetune_epoch_s: <seconds>``."""

from __future__ import annotations

import argparse

from biencoder.bench.common import Devices, corpus_found
from biencoder.bench.epoch_phases import bench_epoch_phases, print_phases


def finetune_overrides(cuda: bool) -> list[str]:
    """The default fine-tuning run (data=arguana, MiniLM, exact search) on CUDA; the tiny model on the demo corpus on a
    CPU, so CI runs the same code."""
    common = [
        "+variant=ln_relu",
        "trainer.progress=false",
        "eval.tasks=false",
        "eval.index=exact",
        "negatives.index=exact",
    ]
    return common + (["data=arguana"] if cuda else ["model=tiny"])


def run(args: argparse.Namespace, devices: Devices) -> None:
    overrides = finetune_overrides(devices.cuda is not None) + list(args.run_overrides)
    print(f"\n6. one fine-tuning epoch by phase ({' '.join(overrides)}; mean of {args.epochs} after a warm-up)")
    if devices.cuda and not corpus_found(args.corpus):
        return
    result = bench_epoch_phases(overrides, args.epochs)
    print_phases(result)
    train, steps, triplets = result["phases"]["train"], result["steps"], result["triplets"]
    print(f"   train: {1000 * train / steps:.2f} ms per step ({result['step']}), {triplets / train:.1f} triplets/s")
    print(f"finetune_epoch_s: {result['phases']['epoch']:.3f}")
