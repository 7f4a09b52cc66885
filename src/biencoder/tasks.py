"""``python -m biencoder.tasks <root> --split test [--json]`` (``biencoder-tasks``): the pool sizes of the 8 official
tasks. The tasks and their scores are :mod:`biencoder.engine.retrieval.official_tasks`.
"""

from __future__ import annotations

import argparse
import sys

from .engine.data.corpus import read_corpus, split_name
from .engine.files import strict_json
from .engine.retrieval.official_tasks import pool_sizes
from .errors import command


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m biencoder.tasks", description="Pool sizes of the 8 official tasks (queries, false candidates)."
    )
    parser.add_argument("root", help="corpus root (holding 02-extracted-arguments/) or 'demo'")
    parser.add_argument(
        "--split",
        default="test",
        metavar="{train,val,test}",
        help="the split (the corpus's folder names training/validation work too)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    split = read_corpus(args.root).paired(split_name(args.split))
    sizes = pool_sizes(split)
    if args.json:
        print(strict_json(sizes, indent=2))
    else:
        print(f"{'task':<6} {'queries':>8} {'candidates':>11} {'per query':>10}")
        for task, s in sizes.items():
            print(f"{task:<6} {s['queries']:>8} {s['candidates']:>11} {s['candidates'] / s['queries']:>10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
