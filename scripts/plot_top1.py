#!/usr/bin/env python
"""Compare biencoder runs: ``python scripts/plot_top1.py logs/ [--metric top1] [--split val test] [--internals]``,
the same program as the installed ``biencoder-plot`` (which works from any directory).

Writes <logs>/top1.png (+ .md/.csv tables) and prints the summary table with bootstrap CIs, the paired comparison of
every cell against ``plain``, every cell against zero-shot and TF-IDF, and the factorial effects when the cells cross
two or more factors. See ``biencoder.summary`` and docs/comparing-runs.md for the details.
"""

import sys

from biencoder.summary import main

if __name__ == "__main__":
    sys.exit(main())
