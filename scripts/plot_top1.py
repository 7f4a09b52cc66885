#!/usr/bin/env python
"""Compare biencoder runs: ``python scripts/plot_top1.py logs/ [--metric top1] [--split val test] [--internals]``.

Writes <logs>/top1.png (+ .md/.csv tables) and prints the summary table with bootstrap CIs and the paired
comparison of every cell against ``plain``. See ``biencoder.summary`` for the details.
"""

import sys

from biencoder.summary import main

if __name__ == "__main__":
    sys.exit(main())
