"""Item 3: the cost of mining, all-points k-NN (k = 10) over N = 1k, 4k, 16k synthetic 128-d embeddings, BallTree
against exact search, with the growth exponent b of seconds ∝ N^b."""

from __future__ import annotations

import argparse
import functools

import numpy as np
import torch

from biencoder.bench.common import Devices, device_label, timed
from biencoder.engine.config.schema import INDEXES
from biencoder.engine.retrieval.search import NeighbourIndex

SIZES = (1000, 4000, 16000)


def _all_neighbours(data: np.ndarray, kind: str, device: torch.device, k: int):
    return NeighbourIndex(data, kind, device).query(data, k)


def bench_mining(device: torch.device, indexes=INDEXES, sizes=SIZES, dim: int = 128, k: int = 10) -> list[dict]:
    """Per index of ``indexes``: seconds of the k-NN of all ``sizes`` points and the growth exponent."""
    rows = []
    for kind in indexes:
        times = []
        for n in sizes:
            data = np.random.default_rng(n).normal(size=(n, dim)).astype(np.float32)
            seconds, _ = timed(functools.partial(_all_neighbours, data, kind, device, k), sync=device)
            times.append(seconds)
        exponent = np.polyfit(np.log(sizes), np.log(times), 1)[0]
        rows.append({"index": kind, "times": times, "exponent": exponent})
    return rows


def run(args: argparse.Namespace, devices: Devices) -> None:
    print("\n3. mining: k-NN (k=10) of all N points, 128-d, seconds (growth exponent b: s ~ N^b)")
    for device in devices.all():
        # the BallTree runs on the CPU whatever the device: measured once
        for r in bench_mining(device, INDEXES if device == devices.cpu else ("exact",)):
            label = device_label(device) if r["index"] == "exact" else "CPU (scikit-learn)"
            times = "  ".join(f"N={n // 1000}k {t:7.3f}s" for n, t in zip(SIZES, r["times"], strict=True))
            print(f"{label:<22} {r['index']:<9} {times}   b={r['exponent']:.2f}")
