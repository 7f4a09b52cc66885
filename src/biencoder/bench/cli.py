"""The bench's command line (``python scripts/bench.py``, ``python -m biencoder.bench``): which items run, in which
order, on which devices; the last line printed is item 1's ``eval_speedup_vs_seed_style`` when it ran."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from biencoder.bench import (
    ablation_sweep,
    eval_speed,
    finetune_epoch,
    frozen_epoch,
    mining_cost,
    peer,
    step_counts,
    train_throughput,
)
from biencoder.bench.common import DEFAULT_CORPUS, Devices, device_label

#: the items by their ``--items`` name, in the order of their numbers
ITEMS = ("eval", "train", "mining", "frozen", "steps", "finetune", "sweep", "peer")
#: the order they run in (the cheap per-step counts before the real-corpus epoch), each an item module's ``run``
RUNS = (
    ("eval", eval_speed.run),
    ("train", train_throughput.run),
    ("mining", mining_cost.run),
    ("steps", step_counts.run),
    ("frozen", frozen_epoch.run),
    ("finetune", finetune_epoch.run),
    ("peer", peer.run),
    ("sweep", ablation_sweep.run),
)

EXAMPLES = """examples:
  bench.py                              # CPU: all items, a few minutes on 2 cores
  bench.py --items frozen steps         # only some items
  bench.py --gpu-only                   # on a CUDA machine (refused without one): items 2, 5, 6, 8
  bench.py --items sweep --jobs 4 8 12  # on a CUDA machine: item 7 (20 runs per job count)
  bench.py --items sweep --jobs 8 --keep sweeps/ --run-overrides loss=infonce  # kept, another loss
  bench.py --items peer                 # on a CUDA machine: item 8, sentence-transformers' trainer as a peer"""


def chosen_items(args: argparse.Namespace) -> set[str]:
    """The items ``args`` ask for: ``--gpu-only`` keeps the GPU targets of the step and the epoch (2, 5, 6) and the
    peer (8); the ablation (7: 20 runs per job count) runs only when named, ``--items sweep``."""
    items = set(args.items) - ({"frozen"} if args.skip_frozen else set())
    if args.gpu_only:
        items &= {"train", "steps", "finetune", "sweep", "peer"}
    if args.items == list(ITEMS):
        items.discard("sweep")
    return items


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench.py",
        description="Benchmarks of biencoder's hot paths, printed as one table (see BENCHMARKS.md "
        "for recorded figures).",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS, help="ArguAna root (default: ARGUANA_ROOT)")
    parser.add_argument("--items", nargs="+", choices=ITEMS, default=list(ITEMS), help="which items to run")
    parser.add_argument(
        "--gpu-only",
        action="store_true",
        help="on a CUDA machine: the GPU rows of item 2, the per-step counts (5), the fine-tuning "
        "epoch (6) and the sentence-transformers peer (8); the ablation (7) runs only with --items sweep",
    )
    parser.add_argument("--steps", type=int, default=10, help="timed training steps per row")
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs of items 4 and 6 (after one warm-up)")
    parser.add_argument("--skip-frozen", action="store_true", help="skip item 4 (the frozen real-corpus epoch)")
    parser.add_argument(
        "--jobs",
        type=int,
        nargs="+",
        default=[4, 8],
        help="item 7: concurrent jobs of the 20-run sweep, one timing per value (CUDA only)",
    )
    parser.add_argument(
        "--compiled",
        action="store_true",
        help="item 2 on CUDA: only the rows whose step is compiled by torch.compile, then captured (minutes)",
    )
    parser.add_argument(
        "--keep", type=Path, default=None, help="item 7: keep the sweep's run folders under this folder (jobs<N>/)"
    )
    parser.add_argument(
        "--run-overrides",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="items 4, 6 and 7: overrides added to the measured runs (e.g. model.head.hidden=[256], "
        "trainer.cuda_graphs=false, loss=infonce)",
    )
    return parser.parse_args(argv)


def main(argv=None) -> int:
    """Runs the chosen items and prints their table; 2 (one line on stderr) for ``--gpu-only`` without CUDA."""
    args = parse_args(argv)
    items = chosen_items(args)
    devices = Devices.detect()
    if args.gpu_only and devices.cuda is None:
        print(
            "bench.py: --gpu-only measures the GPU targets, but torch sees no CUDA device "
            f"(torch.cuda.is_available() is False, torch {torch.__version__}); install a CUDA build of torch, "
            "or drop --gpu-only for the CPU items",
            file=sys.stderr,
        )
        return 2
    print(
        f"biencoder bench | torch {torch.__version__} | CPU threads {torch.get_num_threads()} | "
        f"GPU {device_label(devices.cuda) if devices.cuda else 'none'}"
    )
    headlines = [run(args, devices) for name, run in RUNS if name in items]
    for line in filter(None, headlines):
        print(f"\n{line}")
    return 0
