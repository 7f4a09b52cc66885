"""Item 2: training throughput of a full fine-tuning step (encoder forward + backward + AdamW).

Triplets/s and tokens/s of the tiny model on the CPU, and of MiniLM-sized and bert-base-sized random-init encoders
on CUDA, with an MFU estimate for bf16 (:func:`biencoder.bench.common.train_flops_per_step` against the GPU's dense
bf16 peak).
"""

from __future__ import annotations

import argparse

import torch

from biencoder.bench.common import Devices, device_label, mfu, random_model, timed, train_flops_per_step
from biencoder.engine.modeling.loss import TripletCELoss
from biencoder.engine.training.flat_params import FlatParameters


def _step_fn(model, device: torch.device, batch: int, seq_len: int, dtype):
    """One training step of ``model`` on a fixed random batch of ``batch`` triplets of ``seq_len`` tokens, as the
    runner's (EpochTrainer): fused AdamW over the parameters as one flat tensor (one group here, not two)."""
    loss_fn = TripletCELoss()
    flat = FlatParameters(list(model.parameters()), model.unused_parameters())
    optimizer = torch.optim.AdamW(flat.tensors(), lr=1e-5, fused=True)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 30000, (3 * batch, seq_len), generator=gen)
    mask = torch.ones_like(ids)
    if device.type == "cuda":
        ids, mask = ids.pin_memory(), mask.pin_memory()

    def step():
        i, m = ids.to(device, non_blocking=True), mask.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            point, counter, negative = model.embed(i, m).chunk(3)
            out = loss_fn(model, point, counter, negative)
        optimizer.zero_grad(set_to_none=False)
        out.total.backward()
        optimizer.step()

    return step


def bench_train(kind: str, device: torch.device, batch: int, seq_len: int, steps: int, dtype) -> dict:
    """Per-second figures of ``steps`` timed steps (after 2 warm-up steps) of the random-init encoder ``kind``;
    ``dtype``: the autocast dtype (None: fp32)."""
    model = random_model(kind, device)
    model.train()
    step = _step_fn(model, device, batch, seq_len, dtype)
    for _ in range(2):  # warm-up (allocator, kernels)
        step()
    seconds, _ = timed(lambda: [step() for _ in range(steps)], sync=device)
    per_step = seconds / steps
    flops = train_flops_per_step(model.encoder.config, 3 * batch, seq_len)
    return {
        "model": kind,
        "batch": f"{batch} triplets x {seq_len} tok",
        "precision": "bf16" if dtype else "fp32",
        "triplets_s": batch / per_step,
        "tokens_s": 3 * batch * seq_len / per_step,
        "tflops": flops / per_step / 1e12,
        "mfu": mfu(flops / per_step, device, dtype),
    }


def run(args: argparse.Namespace, devices: Devices) -> None:
    print("\n2. training throughput (encoder fwd+bwd+AdamW, random init)")
    print(
        f"{'device':<22} {'model':<10} {'batch':<22} {'prec':<5} {'triplets/s':>11} {'tokens/s':>10} "
        f"{'TFLOP/s':>8} {'MFU':>6}"
    )
    cpu, cuda = devices.cpu, devices.cuda
    rows = []
    if not args.gpu_only:
        rows.append((cpu, bench_train("tiny", cpu, 16, 128, args.steps, None)))
        rows.append((cpu, bench_train("minilm", cpu, 16, 128, max(2, args.steps // 5), None)))
    if cuda:
        for kind, batch in (("minilm", 64), ("bert-base", 32)):
            rows.append((cuda, bench_train(kind, cuda, batch, 256, args.steps, torch.bfloat16)))
            rows.append((cuda, bench_train(kind, cuda, batch, 256, args.steps, None)))
    for device, r in rows:
        shown = f"{100 * r['mfu']:.0f}%" if r["mfu"] is not None else "n/a"
        print(
            f"{device_label(device):<22} {r['model']:<10} {r['batch']:<22} {r['precision']:<5} "
            f"{r['triplets_s']:>11.1f} {r['tokens_s']:>10.0f} {r['tflops']:>8.2f} {shown:>6}"
        )
    if not cuda:
        for model, batch in (("minilm", "64 triplets x 256 tok"), ("bert-base", "32 triplets x 256 tok")):
            print(f"{'GPU':<22} {model:<10} {batch:<22} {'bf16':<5} {'not measured (no CUDA device)':>37}")
