#!/usr/bin/env python
"""The import graph of the biencoder package as Markdown (``--json``: one JSON object); see
:mod:`biencoder.bench.import_graph`. ``docs/architecture.md`` quotes its output."""

import sys

from biencoder.bench.import_graph import main

if __name__ == "__main__":
    sys.exit(main())
