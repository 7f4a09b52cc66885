#!/usr/bin/env python
"""Benchmarks of biencoder's hot paths, printed as one table: ``python scripts/bench.py [--items ...]``.

The items, their figures and the options are :mod:`biencoder.bench`'s (``--help`` lists them); BENCHMARKS.md has the
recorded figures.
"""

import sys

from biencoder.bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
