"""``python -m biencoder.export <run> <out_dir>`` (``biencoder-export``): a trained run as a sentence-transformers
model plus its pair classifier (:mod:`biencoder.engine.inference.export` says what the folder holds and how to use it,
and holds the Python names: ``export``, ``load_pair_classifier``, ``embed``).
"""

from __future__ import annotations

import argparse
import sys

from .engine.inference.export import CLASSIFIER, export
from .errors import command


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m biencoder.export",
        description="Export a run as a sentence-transformers model + pair classifier.",
    )
    parser.add_argument("run", help="a run folder of biencoder.train (or its best.pt)")
    parser.add_argument("out_dir", help="a new (or empty) folder for the sentence-transformers model")
    args = parser.parse_args(argv)
    out = export(args.run, args.out_dir, progress=sys.stderr.isatty())
    print(
        f"sentence-transformers model: {out}  (SentenceTransformer('{out}').encode(texts) = the sim embeddings)\n"
        f"pair classifier: {out / CLASSIFIER}  (biencoder.load_pair_classifier('{out}'))"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
