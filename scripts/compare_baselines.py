#!/usr/bin/env python
"""Does any cell beat the untrained encoder? The table of ``plot_top1.py <sweep> --baselines`` alone: no figure,
nothing written.

    python scripts/compare_baselines.py logs/sweeps/<time> [--queries all|unseen|seen] [--n-boot N]
        [--data-root CORPUS] [--encoder FOLDER]   # runs copied from another machine: where these are here

Every cell against zero-shot and TF-IDF on the same test queries, each from the cell's own config; see
:mod:`biencoder.report.baselines`.
"""

from __future__ import annotations

import argparse
import sys

from biencoder.errors import command
from biencoder.report.baselines import baseline_markdown, baseline_table
from biencoder.report.runs import QUERY_GROUPS, assign_cells, find_runs
from biencoder.report.statistics import N_BOOT


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="logs folder(s) or run folders, searched recursively")
    parser.add_argument("--queries", choices=QUERY_GROUPS, default="all")
    parser.add_argument(
        "--n-boot", type=int, default=N_BOOT, help=f"bootstrap resamples (default {N_BOOT}, as every table)"
    )
    parser.add_argument("--data-root", help="the corpus folder, when the runs' data.root is not on this machine")
    parser.add_argument(
        "--encoder",
        help="the untrained encoder (folder or Hugging Face id), when the runs' "
        "model.encoder.name_or_path is not on this machine",
    )
    args = parser.parse_args(argv)
    runs = find_runs(args.paths)
    assign_cells(runs)
    print(
        baseline_markdown(baseline_table(runs, args.queries, args.n_boot, args.data_root, args.encoder), args.queries)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
