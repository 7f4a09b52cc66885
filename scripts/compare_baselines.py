#!/usr/bin/env python
"""Does any cell beat the untrained encoder? The table of ``plot_top1.py <sweep> --baselines`` alone: no figure,
nothing written.

    python scripts/compare_baselines.py logs/sweeps/<time> [--queries all|unseen|seen] [--n-boot 10000]

Every cell against zero-shot and TF-IDF on the same test queries, each from the cell's own config; see
:mod:`biencoder.report.baselines`.
"""

from __future__ import annotations

import argparse
import sys

from biencoder.errors import command
from biencoder.report.baselines import baseline_markdown, baseline_table
from biencoder.report.runs import QUERY_GROUPS, assign_cells, find_runs


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="logs folder(s) or run folders, searched recursively")
    parser.add_argument("--queries", choices=QUERY_GROUPS, default="all")
    parser.add_argument("--n-boot", type=int, default=10000)
    args = parser.parse_args(argv)
    runs = find_runs(args.paths)
    assign_cells(runs)
    print(baseline_markdown(baseline_table(runs, args.queries, args.n_boot), args.queries))
    return 0


if __name__ == "__main__":
    sys.exit(main())
