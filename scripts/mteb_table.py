#!/usr/bin/env python
"""The MTEB protocol's table: baselines and cells with bootstrap intervals, each cell against zero-shot on nDCG@10.

    python scripts/mteb_table.py results/mteb_arguana [--n-boot N] [--out results/mteb_arguana/table.md]

Reads the evaluation records of ``python -m biencoder.evaluate eval.protocol=mteb`` in the folder, named
``zero_shot.json``, ``tfidf.json`` and ``<cell>_seed<N>.json``; see :mod:`biencoder.report.mteb`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from biencoder.errors import command
from biencoder.report.mteb import mteb_markdown, mteb_rows, read_records
from biencoder.report.statistics import N_BOOT


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="the folder of the evaluation records")
    parser.add_argument(
        "--n-boot", type=int, default=N_BOOT, help=f"bootstrap resamples (default {N_BOOT}, as every table)"
    )
    parser.add_argument("--out", help="also write the tables to this Markdown file")
    args = parser.parse_args(argv)
    baselines, cells = read_records(args.folder)
    text = mteb_markdown(*mteb_rows(baselines, cells, args.n_boot), args.n_boot)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
