"""``python -m biencoder.bench``: the same as ``python scripts/bench.py``."""

import sys

from biencoder.bench.cli import main

sys.exit(main())
