"""Item 2: training throughput of a full fine-tuning step (encoder forward + backward + AdamW).

Triplets/s and tokens/s of the tiny model on the CPU, and of MiniLM-sized and bert-base-sized random-init encoders
on CUDA, with an MFU estimate for bf16 (:func:`biencoder.bench.common.train_flops_per_step` against the GPU's dense
bf16 peak).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch

from biencoder.bench.common import Devices, device_label, mfu, random_model, timed, train_flops_per_step
from biencoder.engine.modeling.loss import TripletCELoss
from biencoder.engine.training.flat_params import FlatParameters
from biencoder.engine.training.step_graph import GraphedStep
from biencoder.engine.training.triplets import TripletStep


@dataclass(frozen=True)
class TrainRow:
    """One row of the table: the random-init encoder ``kind``, ``batch`` triplets of ``seq_len`` tokens, the autocast
    ``dtype`` (None: fp32), and whether the step runs as a CUDA graph."""

    kind: str
    batch: int
    seq_len: int
    dtype: torch.dtype | None = None
    graphs: bool = False
    compile: bool = False  # torch.compile the step module first (Inductor's fused kernels), then capture it

    @property
    def step(self) -> str:
        return ("compiled " if self.compile else "") + ("graph" if self.graphs else "eager")

    @property
    def label(self) -> str:
        return f"{self.kind} {self.batch}x{self.seq_len} {'bf16' if self.dtype else 'fp32'} {self.step}"


def _step_fn(model, device: torch.device, row: TrainRow):
    """One training step of ``model`` on a fixed random batch of the ``row``'s shape (nothing padded), as the
    runner's (EpochTrainer): fused AdamW over the parameters as one flat tensor (one group here, not
    two), the pair classifier's loss included; with ``graphs`` (CUDA) captured and replayed as the runner's
    (:class:`~biencoder.engine.training.step_graph.GraphedStep`)."""
    flat = FlatParameters(list(model.parameters()), model.unused_parameters())
    optimizer = torch.optim.AdamW(flat.tensors(), lr=1e-5, fused=True)
    module = TripletStep(model, TripletCELoss())
    if row.compile:
        module = torch.compile(module)  # compiled in the first warm-up step; the shapes never change
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 30000, (3 * row.batch, row.seq_len), generator=gen)
    mask = torch.ones_like(ids)
    if device.type == "cuda":
        ids, mask = ids.pin_memory(), mask.pin_memory()

    def inputs() -> dict:
        # padded=False: the host knows no row is padded, as the runner tells the encoder (encoder_mask)
        return {
            "input_ids": ids.to(device, non_blocking=True),
            "attention_mask": mask.to(device, non_blocking=True),
            "padded": False,
        }

    if row.graphs:
        graphed = GraphedStep(module, optimizer, device, row.dtype)
        return lambda: graphed(inputs())

    def step():
        with torch.autocast(device.type, dtype=row.dtype, enabled=row.dtype is not None):
            out = module(**inputs())
        optimizer.zero_grad(set_to_none=False)
        out.total.backward()
        optimizer.step()

    return step


def bench_train(row: TrainRow, device: torch.device, steps: int) -> dict:
    """Per-second figures of ``steps`` timed steps of ``row`` (after 3 warm-up steps: a graph's eager steps and its
    capture)."""
    model = random_model(row.kind, device)
    model.train()
    step = _step_fn(model, device, row)
    for _ in range(3):  # warm-up (allocator, kernels; eager steps and the capture of a graph)
        step()
    seconds, _ = timed(lambda: [step() for _ in range(steps)], sync=device)
    per_step = seconds / steps
    flops = train_flops_per_step(model.encoder.config, 3 * row.batch, row.seq_len)
    return {
        "model": row.kind,
        "batch": f"{row.batch} triplets x {row.seq_len} tok",
        "precision": "bf16" if row.dtype else "fp32",
        "step": row.step,
        "attention": getattr(model.encoder.config, "_attn_implementation", "?"),
        "ms": 1000 * per_step,
        "triplets_s": row.batch / per_step,
        "tokens_s": 3 * row.batch * row.seq_len / per_step,
        "tflops": flops / per_step / 1e12,
        "mfu": mfu(flops / per_step, device, row.dtype),
    }


#: the CUDA rows; bf16 rows run eager and as a graph. MiniLM at 16 x 128 is the default fine-tuning step; 64 x 256 and
#: bert-base at 32 x 256 are the throughput rows
CUDA_ROWS = tuple(
    TrainRow(kind, batch, seq_len, dtype, graphs)
    for kind, batch, seq_len, dtype in (
        ("minilm", 16, 128, torch.bfloat16),
        ("minilm", 64, 256, torch.bfloat16),
        ("minilm", 64, 256, None),
        ("bert-base", 32, 256, torch.bfloat16),
        ("bert-base", 32, 256, None),
    )
    for graphs in ((False, True) if dtype is not None else (False,))
)


#: ``--compiled``: the step compiled by torch.compile and then captured (the trainer's ``trainer.compile`` runs it
#: without graphs): what Inductor's fused kernels add to the graph
COMPILED_ROWS = (
    TrainRow("minilm", 16, 128, torch.bfloat16, graphs=True, compile=True),
    TrainRow("bert-base", 32, 256, torch.bfloat16, graphs=True, compile=True),
)


def _guarded(label: str, fn, *args) -> dict | str:
    """``fn(*args)``, or the one line that says why it failed (a GPU-only path that breaks must not end the bench)."""
    try:
        return fn(*args)
    except Exception as err:  # noqa: BLE001 - every failure is printed, none ends the other rows
        return f"{label}: failed ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})"


def run(args: argparse.Namespace, devices: Devices) -> None:
    print("\n2. training throughput (encoder fwd+bwd+AdamW, pair classifier included, random init)")
    print(
        f"{'device':<22} {'model':<10} {'batch':<22} {'prec':<5} {'step':<14} {'ms/step':>8} {'triplets/s':>11} "
        f"{'tokens/s':>10} {'TFLOP/s':>8} {'MFU':>6}"
    )
    cpu, cuda = devices.cpu, devices.cuda
    rows = []
    if not args.gpu_only:
        rows.append((cpu, bench_train(TrainRow("tiny", 16, 128), cpu, args.steps)))
        rows.append((cpu, bench_train(TrainRow("minilm", 16, 128), cpu, max(2, args.steps // 5))))
    if cuda:
        chosen = COMPILED_ROWS if args.compiled else CUDA_ROWS
        rows += [(cuda, _guarded(row.label, bench_train, row, cuda, args.steps)) for row in chosen]
    for device, r in rows:
        if isinstance(r, str):
            print(f"{device_label(device):<22} {r}")
            continue
        shown = f"{100 * r['mfu']:.0f}%" if r["mfu"] is not None else "n/a"
        print(
            f"{device_label(device):<22} {r['model']:<10} {r['batch']:<22} {r['precision']:<5} {r['step']:<14} "
            f"{r['ms']:>8.2f} {r['triplets_s']:>11.1f} {r['tokens_s']:>10.0f} {r['tflops']:>8.2f} {shown:>6}"
        )
    if cuda:
        print(f"   attention: {rows[-1][1]['attention'] if isinstance(rows[-1][1], dict) else '?'} (encoder config)")
    else:
        for model, batch in (("minilm", "64 triplets x 256 tok"), ("bert-base", "32 triplets x 256 tok")):
            print(f"{'GPU':<22} {model:<10} {batch:<22} {'bf16':<5} {'not measured (no CUDA device)':>37}")
