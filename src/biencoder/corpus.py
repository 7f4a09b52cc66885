"""``python -m biencoder.corpus stats <root> [--json]`` (``biencoder-corpus``): the counts of an ArguAna counterargs
corpus per split, the cross-split overlap and what ``data.dedup`` drops. The reader is :mod:`biencoder.engine.corpus`;
its public names stay importable from here (``from biencoder.corpus import read_corpus``).
"""

from __future__ import annotations

import argparse
import sys
import time

from .engine.corpus import Corpus, PairedSplit, read_corpus, run_splits, seen_queries, split_name
from .engine.layout import EXTRACTED, CorpusError, resolve_root
from .engine.schema import demo_root
from .engine.state import strict_json
from .errors import command

__all__ = ["Corpus", "CorpusError", "PairedSplit", "demo_root", "main", "read_corpus", "resolve_root", "run_splits",
           "seen_queries", "split_name"]  # the Python names, from the engine


def format_stats(counts: dict[str, dict[str, int]]) -> str:
    """A fixed-width table: one row per statistic, one column per split."""
    keys = list(next(iter(counts.values())))
    width = max(len(k) for k in keys)
    lines = [f"{'':{width}}  " + "  ".join(f"{s:>10}" for s in counts)]
    lines += [f"{k:{width}}  " + "  ".join(f"{counts[s][k]:>10}" for s in counts) for k in keys]
    return "\n".join(lines)


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m biencoder.corpus", description="Counts of an ArguAna counterargs corpus per split.")
    sub = parser.add_subparsers(dest="command", required=True)
    stats = sub.add_parser("stats", help="count themes, debates, points, counters and pairs per split")
    stats.add_argument("root", help=f"corpus root (holding {EXTRACTED}/) or that folder itself; 'demo' for the bundled one")
    stats.add_argument("--json", action="store_true",
                       help="print one JSON object: splits (counts per split), overlap, dedup_dropped")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    corpus = read_corpus(args.root)
    overlap = corpus.overlap()
    if args.json:
        print(strict_json({"splits": corpus.counts, "overlap": overlap,
                           "dedup_dropped": corpus.deduplicated().dropped}, indent=2))
    else:
        print(f"{corpus.root}  (read in {time.perf_counter() - start:.2f} s)")
        print(format_stats(corpus.counts))
        print("\ncross-split overlap (the same text in two splits: a debate filed under two themes)")
        print(f"{'':18} {'pairs (point+counter as a pair of b)':>38} {'texts':>16} {'debates (URL)':>15}")
        for key, o in overlap.items():
            print(f"{key:18} {o['pairs']:>26} of {o['of_pairs']:<9} {o['texts']:>6} of {o['of_texts']:<6} "
                  f"{o['debates']:>5} of {o['of_debates']:<6}")
        dropped = corpus.deduplicated().dropped
        print(f"\ndata.dedup=true (the default) drops train {dropped['train']} of {corpus.counts['train']['pairs']}, "
              f"val {dropped['val']} of {corpus.counts['val']['pairs']}, test 0 pairs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
