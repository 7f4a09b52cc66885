"""Item 5: operator calls and host synchronisations per training step.

One step is :meth:`biencoder.engine.training.epoch.EpochTrainer.train_step` on a ready batch (demo corpus) of the
MiniLM-sized encoder (random init, trained) and of the frozen-encoder head, counted with ``torch.profiler``
(:func:`biencoder.bench.common.count_step`) over 32 (frozen) or 8 steps, so that the step statistics, computed on one
step in 8 (:class:`biencoder.engine.training.epoch.EpochSums`), count at their share; and ms per step.
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import tempfile
from pathlib import Path

from biencoder.bench.common import Devices, bert_sizes, compose_config, count_step, device_label
from biencoder.engine.training.epoch import EpochSums
from biencoder.engine.training.runner import Runner
from biencoder.engine.training.step_graph import WARMUP, WARMUP_LATER


def step_overrides(frozen: bool, cache_dir: Path, size: str = "minilm") -> list[str]:
    """One MiniLM-sized training step on the demo corpus: the encoder trained (random init of :func:`bert_sizes`
    ``size``, 16 triplets) or frozen (the packaged MiniLM's cached pooled vectors, the frozen_arguana head settings:
    32 triplets)."""
    if frozen:
        return [
            "+variant=ln_relu",
            "trainer.progress=false",
            "model.encoder.freeze=true",
            "model.pooling=mean",
            "trainer.batch_size=32",
            "trainer.head_lr=3e-4",
            f"trainer.cache_dir={cache_dir}",
            "eval.baselines=false",
        ]
    return [
        "+variant=ln_relu",
        "trainer.progress=false",
        "model=tiny",
        "model.max_length=128",
        *(f"model.encoder.random_init.{k}={v}" for k, v in bert_sizes()[size].items()),
        "eval.baselines=false",
    ]


def _ready_batches(runner: Runner, negatives, count: int):
    """``count`` training batches of the runner with ``negatives``, assembled beforehand: a step here is
    :meth:`EpochTrainer.train_step` on a ready batch."""
    batches = itertools.islice(
        (inputs for epoch in itertools.count() for _, inputs in runner.trainer.batches(epoch, negatives)), count
    )
    return iter(list(batches))


def bench_step_counts(frozen: bool, steps: int, size: str = "minilm") -> dict:
    """:func:`count_step` of :meth:`EpochTrainer.train_step` for the MiniLM-sized model (trained: of ``size``) trained
    or frozen (demo corpus)."""
    scratch = Path(tempfile.mkdtemp(prefix="bench-step-"))
    try:
        runner = Runner(compose_config(step_overrides(frozen, scratch / "cache", size)), scratch / "run")
        negatives = runner.trainer.mine(0, runner.evaluation.embed("train").sim)
        runner.model.train()
        runner.model.encoder.train(not runner.frozen)
        # a graphed step captures in its first steps (the eager warm-ups, then each batch shape's capture)
        warmup = 2 + 2 * (WARMUP + WARMUP_LATER) if runner.trainer.mode.graphs else 2
        batches = _ready_batches(runner, negatives, 2 * steps + warmup)
        sums = EpochSums(runner.trainer.settings.stats_every)
        result = count_step(lambda: runner.trainer.train_step(next(batches), sums), runner.device, steps, warmup)
        return {
            "model": "MiniLM frozen head" if frozen else "MiniLM-sized",
            "device": device_label(runner.device),
            "batch": runner.trainer.settings.batch_size,
            "step": "graph" if runner.trainer.mode.graphs else "eager",
            **result,
        }
    finally:
        shutil.rmtree(scratch, ignore_errors=True)  # the temporary folder this function made


def run(args: argparse.Namespace, devices: Devices) -> None:
    print("\n5. one training step (EpochTrainer.train_step, demo corpus): operator calls and host syncs per step")
    exempt = (
        "{:g}: the profiler's own cudaDeviceSynchronize at its exit, one per window"
        if devices.cuda
        else "{:g} reads of fused AdamW's CPU step counters"
    )
    for frozen in (False, True):
        # a multiple of trainer.stats_every (8): the step statistics of one step in 8 count at their share
        r = bench_step_counts(frozen, steps=32 if frozen else 8)
        names = ", ".join(f"{k} {v:g}" for k, v in r["sync_names"].items()) or "none"
        print(
            f"   {r['model']:<20} {r['device']:<22} batch {r['batch']:>3} {r['step']:<5} ops/step {r['ops']:7.0f}  "
            f"host syncs/step {r['syncs']:5.1f} ({names}; not counted: {exempt.format(r['exempt'])})  "
            f"{r['ms']:8.1f} ms/step"
        )
