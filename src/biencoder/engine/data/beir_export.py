"""An ArguAna corpus as a BEIR folder (``biencoder-corpus export-beir``): :func:`export_beir`, read back by
:mod:`.beir`."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..files import strict_json
from .beir import QRELS, QRELS_HEADER, BeirError
from .pair_files import _write_atomic


def argument_id(row) -> str:
    """The ``_id`` an argument of an ArguAna corpus gets in :func:`export_beir`: its split folder, theme, debate,
    side and number, ``a`` for a point and ``b`` for a counter (as its file is named)."""
    return f"{row.split}/{row.theme}/{row.debate}/{row.stance}{row.number:02d}{'a' if row.kind == 'point' else 'b'}"


def export_beir(corpus, folder: str | Path) -> dict[str, Path]:
    """Write the official splits of ``corpus`` (an ArguAna :class:`~.corpus.Corpus`) into ``folder`` in the BEIR
    layout, as BEIR's own ArguAna is: ``corpus.jsonl``, every argument that belongs to a pair (title empty, text the
    argument's); ``queries.jsonl``, the points, each with its own argument's ``_id``; ``qrels/train.tsv``, ``dev.tsv``
    and ``test.tsv``, each point's counter with score 1, in the corpus's pair order. Reading it back gives, with
    ``data.pool=positives``, the paired splits' texts, relevance and candidates. Each file is written atomically; an
    existing one is never overwritten (:class:`BeirError`)."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise BeirError(f"'{folder}' is a file: export into a folder")
    names = ["corpus.jsonl", "queries.jsonl", *(f"qrels/{f}" for f in QRELS.values())]
    taken = [folder / name for name in names if (folder / name).exists()]
    if taken:
        raise BeirError(f"'{taken[0]}' exists: export into a new or empty folder (nothing was written)")
    args = corpus.arguments
    pairs = corpus.pairs
    ids = {i: argument_id(row) for i, row in zip(args.index, args.itertuples(), strict=True)}
    in_pair = np.sort(np.concatenate([pairs["point_row"].to_numpy(), pairs["counter_row"].to_numpy()]))
    corpus_lines = [
        strict_json({"_id": ids[i], "title": "", "text": args.at[i, "text"]}, ensure_ascii=False) + "\n"
        for i in in_pair
    ]
    query_lines = [
        strict_json({"_id": ids[i], "text": args.at[i, "text"]}, ensure_ascii=False) + "\n" for i in pairs["point_row"]
    ]
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    out = {
        "corpus": _write_atomic(folder / "corpus.jsonl", "".join(corpus_lines)),
        "queries": _write_atomic(folder / "queries.jsonl", "".join(query_lines)),
    }
    for split, file in QRELS.items():
        p = corpus.split_pairs(split)
        lines = ["\t".join(QRELS_HEADER) + "\n"] + [
            f"{ids[q]}\t{ids[c]}\t1\n" for q, c in zip(p["point_row"], p["counter_row"], strict=True)
        ]
        out[split] = _write_atomic(folder / "qrels" / file, "".join(lines))
    return out
