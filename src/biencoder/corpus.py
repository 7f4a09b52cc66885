"""``biencoder-corpus`` (``python -m biencoder.corpus``): what a run's data holds, and ArguAna as pair files.

* ``stats <root>``: the counts of an ArguAna counterargs corpus per split, the cross-split overlap and what
  ``data.dedup`` drops. ``stats train.jsonl val.jsonl test.jsonl`` (or a folder holding ``train.*``, ``val.*``,
  ``test.*``, or one file with a split column): the same for pair files (``data=pairs``: pairs, duplicated pairs,
  distinct texts, given negatives and groups per split, overlap, what dedup drops, and each file's sha256).
* ``export-pairs <corpus> <folder>``: an ArguAna-layout corpus (``demo``: the bundled one) as ``train.jsonl``,
  ``val.jsonl`` and ``test.jsonl`` (anchor = point, positive = counter, group = theme/debate), then read back to show
  that both readers give the same paired splits.
* ``export-beir <corpus> <folder>``: an ArguAna-layout corpus as a BEIR folder (``corpus.jsonl``: every argument of a
  pair; ``queries.jsonl``: the points; ``qrels/train.tsv``, ``dev.tsv``, ``test.tsv``: each point's counter, score 1),
  then read back to show that ``data=beir`` gives the same queries and relevant documents.
* ``negatives <run folder>``: what a run with ``negatives.log=true`` mined, one row per epoch
  (:func:`biencoder.engine.retrieval.negative_record.summarise_record`): the share of negatives whose text is a known
  positive (counter) of another query, the hard negatives' median rank, distance and gap to the positive's distance,
  and how many negatives stayed those of the epoch before.

The readers are :mod:`biencoder.engine.data.corpus` and :mod:`biencoder.engine.data.pair_files` (``read_corpus`` and
``read_pairs`` are also :mod:`biencoder`'s).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .engine.data.arguana import EXTRACTED, CorpusError
from .engine.data.beir import read_beir
from .engine.data.beir_export import export_beir
from .engine.data.corpus import Corpus, read_corpus
from .engine.data.pair_files import EXPORTED, PairFiles, export_pairs, read_pairs
from .engine.data.pair_records import SUFFIXES
from .engine.files import strict_json
from .engine.retrieval.negative_record import summarise_record
from .engine.runs.negative_log import NEGATIVES_DIR, read_negative_log
from .errors import command


def format_stats(counts: dict[str, dict[str, int]]) -> str:
    """A fixed-width table: one row per statistic, one column per split."""
    keys = list(next(iter(counts.values())))
    width = max(len(k) for k in keys)
    lines = [f"{'':{width}}  " + "  ".join(f"{s:>10}" for s in counts)]
    lines += [f"{k:{width}}  " + "  ".join(f"{counts[s][k]:>10}" for s in counts) for k in keys]
    return "\n".join(lines)


def pair_sources(paths: list[str], fmt: str | None = None, columns: dict | None = None) -> dict | None:
    """The ``data`` config of the pair files ``paths`` name (three files: train, val, test; one file with a split
    column; or a folder holding ``train.*``, ``val.*`` and ``test.*``), or None when ``paths`` is one ArguAna root."""
    base = {"layout": "pairs", "format": fmt, "columns": columns or {}}
    if len(paths) == 3:
        return {**base, **dict(zip(("train", "val", "test"), paths, strict=True))}
    if len(paths) != 1:
        raise CorpusError(
            f"{len(paths)} paths: pass one corpus root, one folder or file of pairs, or three pair "
            "files (train, val, test)"
        )
    path = Path(paths[0])
    if path.is_file():
        return {**base, "file": str(path)}
    if str(path) == "demo" or not path.is_dir():
        return None  # the ArguAna reader says what is wrong with it
    found = {
        name: sorted(f for f in path.iterdir() if f.stem == name and f.suffix.lower() in SUFFIXES)
        for name in ("train", "val", "test")
    }
    if not all(found.values()):
        return None
    return {**base, **{name: str(files[0]) for name, files in found.items()}}


def _print_overlap(overlap: dict, debates: bool) -> None:
    print(
        "\ncross-split overlap (the same text in two splits"
        + (": a debate filed under two themes)" if debates else ")")
    )
    print(
        f"{'':18} {'pairs (both texts as a pair of b)':>38} {'texts':>16}"
        + (f" {'debates (URL)':>15}" if debates else "")
    )
    for key, o in overlap.items():
        print(
            f"{key:18} {o['pairs']:>26} of {o['of_pairs']:<9} {o['texts']:>6} of {o['of_texts']:<6}"
            + (f" {o['debates']:>5} of {o['of_debates']:<6}" if debates else "")
        )


def stats(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    if any("=" not in c for c in args.column):
        raise CorpusError(
            f"--column {next(c for c in args.column if '=' not in c)}: use ROLE=NAME, e.g. --column anchor=question"
        )
    columns = dict(c.split("=", 1) for c in args.column)
    data = pair_sources(args.paths, args.format, columns)
    corpus: Corpus | PairFiles = read_pairs(data, option="--column ") if data else read_corpus(args.paths[0])
    overlap = corpus.overlap()
    dropped = corpus.deduplicated(check=False).dropped if data else corpus.deduplicated().dropped
    if args.json:
        print(
            strict_json(
                {
                    "splits": corpus.counts,
                    "overlap": overlap,
                    "dedup_dropped": dropped,
                    **({"files": corpus.files} if data else {}),
                },
                indent=2,
            )
        )
        return 0
    if data:
        for role, f in corpus.files.items():
            print(f"{role}: {f['path']}  ({f['bytes']} bytes, sha256 {f['sha256']})")
        print(
            f"(read in {time.perf_counter() - start:.2f} s; duplicated_pairs: rows that repeat an earlier anchor and "
            "positive, each its own query)"
        )
    else:
        print(f"{corpus.root}  (read in {time.perf_counter() - start:.2f} s)")
    print(format_stats(corpus.counts))
    _print_overlap(overlap, debates=not data)
    print(
        f"\ndata.dedup=true (the default) drops train {dropped['train']} of {corpus.counts['train']['pairs']}, "
        f"val {dropped['val']} of {corpus.counts['val']['pairs']}, test 0 pairs"
    )
    return 0


#: the columns ``negatives`` prints: (summary key, header, format)
NEGATIVE_COLUMNS = (
    ("rate", "random_rate", "{:.2f}"),
    ("share_hard", "hard", "{:.3f}"),
    ("share_positive_of_other", "pos_of_other", "{:.3f}"),
    ("share_positive_of_other_hard", "pos_of_other_hard", "{:.3f}"),
    ("median_rank_hard", "rank_hard", "{:.0f}"),
    ("median_distance_hard", "dist_hard", "{:.3f}"),
    ("median_positive_distance", "dist_pos", "{:.3f}"),
    ("median_gap_hard", "gap_hard", "{:+.3f}"),
    ("share_negative_below_positive_hard", "nearer_than_pos", "{:.3f}"),
    ("share_same_as_previous", "same_as_prev", "{:.3f}"),
)


def negative_summaries(run: Path) -> list[dict]:
    """One :func:`summarise_record` per ``negatives/epoch_<NNN>.npz`` of the run folder ``run``, epoch order, each with
    its ``epoch``; :class:`CorpusError` when there is none."""
    records = read_negative_log(run)
    if not records:
        raise CorpusError(
            f"{run} holds no {NEGATIVES_DIR}/epoch_*.npz: run the training with negatives.log=true "
            "to record what each epoch mined"
        )
    rows, previous = [], None
    for epoch, record in records:
        rows.append({"epoch": epoch, **summarise_record(record, previous)})
        previous = record
    return rows


def negatives(args: argparse.Namespace) -> int:
    rows = negative_summaries(Path(args.run))
    if args.json:
        print(strict_json(rows, indent=2))
        return 0
    print(
        f"{args.run}: {rows[0]['pairs']} training pairs, {len(rows)} epochs. pos_of_other: share of negatives whose "
        "text is the counter (known positive) of another query; rank, dist, gap (negative's distance minus the "
        "positive's): medians over the hard negatives; nearer_than_pos: share of hard negatives nearer the point "
        "than its counter; same_as_prev: share of pairs with last epoch's negative"
    )
    widths = [max(len(header), 8) for _, header, _ in NEGATIVE_COLUMNS]
    print(f"{'epoch':>5}  " + "  ".join(f"{h:>{w}}" for (_, h, _), w in zip(NEGATIVE_COLUMNS, widths, strict=True)))
    for row in rows:
        cells = [
            ("-" if row[key] != row[key] else fmt.format(row[key]))  # NaN: no hard negative, or the first epoch
            for key, _, fmt in NEGATIVE_COLUMNS
        ]
        print(f"{row['epoch']:>5}  " + "  ".join(f"{c:>{w}}" for c, w in zip(cells, widths, strict=True)))
    return 0


def same_splits(corpus: Corpus, pairs: PairFiles) -> list[str]:
    """Where the paired splits of ``corpus`` and of its exported ``pairs`` differ (texts and their order), official
    and deduplicated; empty when they agree."""
    out = []
    for dedup in (False, True):
        a, b = corpus.used(dedup), pairs.used(dedup)
        for name in ("train", "val", "test"):
            if a.paired(name).texts != b.paired(name).texts:
                out.append(
                    f"{name} ({'deduplicated' if dedup else 'official'}: {a.paired(name).n_pairs} pairs in the "
                    f"corpus, {b.paired(name).n_pairs} in the files)"
                )
    return out


def export(args: argparse.Namespace) -> int:
    corpus = read_corpus(args.corpus)
    written = export_pairs(corpus, args.folder)
    pairs = read_pairs({"layout": "pairs", **{name: str(path) for name, path in written.items()}})
    for name, path in written.items():
        print(f"{path}  ({corpus.counts[name]['pairs']} pairs)")
    differ = same_splits(corpus, pairs)
    if differ:
        print(
            "note: the files give other paired splits than the corpus in " + "; ".join(differ) + ": ArguAna's "
            "dedup also removes texts of points without a counter, which pair files do not hold"
        )
    else:
        dedup = corpus.deduplicated()
        print(
            "read back: the same paired splits as the corpus, official ("
            + "/".join(str(corpus.counts[n]["pairs"]) for n in EXPORTED)
            + ") and deduplicated ("
            + "/".join(str(len(dedup.split_pairs(n))) for n in EXPORTED)
            + f"); train on them with data=pairs "
            f"data.train={written['train']} data.val={written['val']} data.test={written['test']}"
        )
    return 0


def export_as_beir(args: argparse.Namespace) -> int:
    corpus = read_corpus(args.corpus)
    written = export_beir(corpus, args.folder)
    beir = read_beir(args.folder)
    for path in written.values():
        print(path)
    differ = [
        name
        for name in ("train", "val", "test")
        if beir.paired(name, "positives").texts != corpus.paired(name, pool="positives").texts
    ]
    if differ:  # never for a corpus read as it is written
        print(
            "note: the BEIR folder gives other queries or relevant documents than the corpus in " + ", ".join(differ)
        )
        return 1
    print(
        f"read back: {len(beir.documents)} documents; the same queries and relevant documents as the corpus's "
        f"pairs ({'/'.join(str(corpus.counts[n]['pairs']) for n in EXPORTED)}); train on them with data=beir "
        f"data.root={args.folder}"
    )
    return 0


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m biencoder.corpus",
        description="What a corpus or pair files hold; ArguAna as pair files or a BEIR folder; what a run mined.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    stats_parser = sub.add_parser("stats", help="counts per split, the cross-split overlap and what data.dedup drops")
    stats_parser.add_argument(
        "paths",
        nargs="+",
        metavar="path",
        help=f"an ArguAna corpus root (holding {EXTRACTED}/) or that folder, 'demo' for the "
        "bundled one; or pair files: train val test, a folder holding train.*, val.* and "
        "test.*, or one file with a split column",
    )
    stats_parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object: splits (counts per split), overlap, dedup_dropped (files)",
    )
    stats_parser.add_argument(
        "--format", choices=sorted(set(SUFFIXES.values())), help="pair files: their format (default: from the suffix)"
    )
    stats_parser.add_argument(
        "--column",
        action="append",
        default=[],
        metavar="ROLE=NAME",
        help="pair files: the column of a role, as data.columns.<role> (e.g. anchor=question)",
    )
    export_parser = sub.add_parser("export-pairs", help="write an ArguAna-layout corpus as train/val/test.jsonl pairs")
    export_parser.add_argument("corpus", help="an ArguAna corpus root, or 'demo' for the bundled one")
    export_parser.add_argument("folder", help="a new or empty folder for train.jsonl, val.jsonl and test.jsonl")
    beir_parser = sub.add_parser("export-beir", help="write an ArguAna-layout corpus as a BEIR folder")
    beir_parser.add_argument("corpus", help="an ArguAna corpus root, or 'demo' for the bundled one")
    beir_parser.add_argument(
        "folder", help="a new or empty folder for corpus.jsonl, queries.jsonl and qrels/{train,dev,test}.tsv"
    )
    negatives_parser = sub.add_parser(
        "negatives", help="what a run with negatives.log=true mined, per epoch (share of known positives, distances)"
    )
    negatives_parser.add_argument("run", help="a run folder holding negatives/epoch_*.npz")
    negatives_parser.add_argument("--json", action="store_true", help="print one JSON list: one object per epoch")
    args = parser.parse_args(argv)
    commands = {"stats": stats, "export-pairs": export, "export-beir": export_as_beir, "negatives": negatives}
    return commands[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
