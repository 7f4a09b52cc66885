#!/usr/bin/env python
"""Does any cell beat the untrained encoder? Paired test of every cell against zero-shot and TF-IDF on test.

    python scripts/compare_baselines.py logs/sweeps/<time> [--queries all|unseen|seen] [--n-boot 10000]
        [--data-root CORPUS] [--encoder FOLDER]   # runs copied from another machine: where these are here

For each cell of the sweep (its complete runs), the per-query test top-1 at the best val epoch (``test_hits.npy``)
is compared with the zero-shot MiniLM cosine and TF-IDF top-1 of the same queries and pools (the epa task =
the per-epoch pool), by the two-level paired bootstrap of ``biencoder.summary`` (seeds, then queries; a baseline
has no seeds, so its row is repeated). One Holm family over every row of the table. ``--queries unseen`` keeps the
test queries whose texts occur in no training or validation pair the runs used (``test_seen.npy``).
The zero-shot vectors are the untrained encoder's, at the runs' own model config (pooling, ``max_length``), through
the embedding cache (frozen runs filled it; for fine-tuned runs they are encoded once, on the CPU, and cached).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

from biencoder.cache import cached_pooled, encoder_fingerprint
from biencoder.corpus import read_corpus
from biencoder.model import build_model
from biencoder.summary import MIN_SEEDS_FOR_SEED_LEVEL, assign_cells, find_runs, holm, paired_bootstrap, verdict
from biencoder.tasks import _cosine, candidate_types, query_ranks, task_masks, tfidf_scores


def baseline_hits(run, data_root: str | None = None, encoder: str | None = None) -> dict[str, np.ndarray]:
    """Per-query epa top-1 [Q] (bool) of zero-shot cosine and TF-IDF on the test split this run used; ``data_root``
    and ``encoder`` replace the run's ``data.root`` and ``model.encoder.name_or_path`` when given."""
    cfg = run.config
    corpus = read_corpus(data_root or cfg["data"]["root"]).used(cfg["data"]["dedup"])
    split = corpus.paired("test", cfg["data"]["max_debates"])
    model_cfg = {**cfg["model"], "encoder": {**cfg["model"]["encoder"], "name_or_path": encoder or
                                             cfg["model"]["encoder"]["name_or_path"]}}
    model, tokenizer = build_model(model_cfg, progress=False)
    pooled = cached_pooled(model, tokenizer, split.texts, cfg["model"]["max_length"], cfg["trainer"]["cache_dir"],
                           encoder_fingerprint(model.encoder))
    mask = task_masks(candidate_types(split))["epa"]
    scores = {"zero-shot": _cosine(pooled[split.query], pooled), "TF-IDF": tfidf_scores(split)}
    return {name: query_ranks(s, mask, split.counter) == 1 for name, s in scores.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--queries", choices=("all", "unseen", "seen"), default="all")
    parser.add_argument("--n-boot", type=int, default=10000)
    parser.add_argument("--data-root", help="the corpus folder, when the runs' data.root is not on this machine")
    parser.add_argument("--encoder", help="the untrained encoder (folder or Hugging Face id), when the runs' "
                        "model.encoder.name_or_path is not on this machine")
    args = parser.parse_args(argv)
    runs = [r for r in find_runs(args.paths) if r.complete and r.hits is not None]
    assign_cells(runs)
    torch.set_grad_enabled(False)
    base = baseline_hits(runs[0], args.data_root, args.encoder)
    seen = np.load(runs[0].path / "test_seen.npy")
    keep = {"all": np.ones_like(seen), "unseen": ~seen, "seen": seen}[args.queries]
    print(f"test queries: {args.queries} ({int(keep.sum())} of {len(keep)}); "
          + ", ".join(f"{name} top-1 {hits[keep].mean():.3f}" for name, hits in base.items()))
    rows = []
    for cell in sorted({r.cell for r in runs}):
        hits = np.stack([r.hits for r in runs if r.cell == cell]).astype(float)[:, keep]
        for name, b in base.items():
            diff, low, high, p = paired_bootstrap(hits, np.tile(b[keep].astype(float), (len(hits), 1)), args.n_boot)
            rows.append((cell, len(hits), hits.mean(), name, diff, low, high, p))
    adjusted = holm([r[-1] for r in rows])
    # paired_bootstrap resamples seeds too only with 3+ of them: the header says which the table's intervals did
    levels = {"seeds+queries" if r[1] >= MIN_SEEDS_FOR_SEED_LEVEL else "queries" for r in rows}
    resampled = (levels.pop() if len(levels) == 1
                 else f"seeds+queries with {MIN_SEEDS_FOR_SEED_LEVEL}+ seeds, else queries")
    print(f"| cell | seeds | test top1 | vs | Δ | 95% CI ({resampled}) | p | p (Holm, {len(rows)}) | verdict |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (cell, n, mean, name, diff, low, high, p), p_adj in zip(rows, adjusted):
        print(f"| {cell} | {n} | {mean:.3f} | {name} | {diff:+.3f} | [{low:+.3f}, {high:+.3f}] | {p:.3f} | {p_adj:.3f} | "
              f"{verdict(diff, p_adj)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
