"""Item 1: evaluation of one split (the real test split when the corpus is found, else the demo's).

The batched retrieve-and-rerank of :func:`biencoder.engine.retrieval.rerank.retrieve_rerank`, with each
nearest-neighbour index (``eval.index``: exact and BallTree), against a faithful re-implementation of the seed
scripts' evaluator (:func:`biencoder.bench.common.seed_style_top1`), on the same embeddings; all must give the same
top-1. The headline, ``eval_speedup_vs_seed_style``, is the speedup with the default ``eval.index`` (the
schema's), the other index's beside it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from biencoder.bench.common import Devices, device_label, is_corpus, random_model, seed_style_top1, timed
from biencoder.engine.config.schema import INDEXES, EvalSchema
from biencoder.engine.data.corpus import read_corpus
from biencoder.engine.machine.runtime import Runtime
from biencoder.engine.modeling.model import Embeddings
from biencoder.engine.retrieval.rerank import Rerank, retrieve_rerank

#: the index a run searches with unless told otherwise: the headline is its figure
DEFAULT_INDEX = EvalSchema().index


def _split_and_embeddings(corpus_root: Path, model, device: torch.device):
    """The test split (real corpus, else demo), its name, and random pooled vectors in which each true counter lies
    near its query (so that top-1 is not trivially 0), with their sim-head vectors."""
    if is_corpus(corpus_root):
        split, name = read_corpus(corpus_root).paired("test"), "ArguAna test"
    else:
        split, name = read_corpus("demo").paired("test"), "demo test"
    gen = torch.Generator().manual_seed(0)
    pooled = torch.randn(len(split.texts), 384, generator=gen)
    pooled[split.counter] = pooled[split.query] + 0.5 * torch.randn(len(split.query), 384, generator=gen)
    with torch.no_grad():
        emb = Embeddings(model.sim_head(pooled.to(device)).float().cpu(), pooled)
    return split, name, emb


def bench_eval(corpus_root: Path, device: torch.device, k: int = 10) -> dict:
    """Seconds of one split's evaluation on ``device``: ``seconds`` and ``speedup`` (over the seed-style loop) per
    index of :data:`INDEXES`, ``seed_s``, ``top1`` (the same for every index and the seed-style loop, or an
    AssertionError) and the ``split``'s label."""
    model = random_model("minilm", device)  # only the heads are used: embeddings are given
    split, name, emb = _split_and_embeddings(corpus_root, model, device)
    size = Runtime(device, "fp32").pair_batch_size(None)  # the block size a run uses on this device
    seconds, top1 = {}, {}
    for index in INDEXES:
        seconds[index], (metrics, _) = timed(
            lambda index=index: retrieve_rerank(model, emb, split, Rerank(k, size, device, index)),
            repeat=3,
            sync=device,
        )
        top1[index] = metrics["top1"]
    t_seed, seed_top1 = timed(lambda: seed_style_top1(model, emb, split, k, device), sync=device)
    assert all(abs(seed_top1 - t) < 1e-12 for t in top1.values()), (seed_top1, top1)
    return {
        "split": f"{name} ({len(split.query)} queries, k={k})",
        "seconds": seconds,
        "seed_s": t_seed,
        "top1": seed_top1,
        "speedup": {index: t_seed / s for index, s in seconds.items()},
    }


def headline(speedup: dict[str, float]) -> str:
    """The last line of the bench: the default index's speedup, then the other index's, labelled."""
    others = "; ".join(f"{index}: {speedup[index]:.1f}" for index in INDEXES if index != DEFAULT_INDEX)
    default = f"{speedup[DEFAULT_INDEX]:.1f} (eval.index={DEFAULT_INDEX}, the default; {others})"
    return f"eval_speedup_vs_seed_style: {default}"


def run(args: argparse.Namespace, devices: Devices) -> str:
    """Prints one row per device; returns the :func:`headline` of the CPU's row."""
    print("\n1. evaluation of one split: batched retrieve+rerank vs seed-style per-pair loop (same top-1)")
    print(
        f"{'device':<22} {'split':<36} {'ours s':>8} {'ours(exact) s':>14} {'seed-style s':>13} {'speedup':>9} "
        f"{'(exact)':>9}"
    )
    line = ""
    for device in devices.all():
        r = bench_eval(args.corpus, device)
        seconds, speedup = r["seconds"], r["speedup"]
        print(
            f"{device_label(device):<22} {r['split']:<36} {seconds['balltree']:>8.3f} {seconds['exact']:>14.3f} "
            f"{r['seed_s']:>13.2f} {speedup['balltree']:>8.1f}x {speedup['exact']:>8.1f}x"
        )
        if device == devices.cpu:
            line = headline(speedup)
    return line
