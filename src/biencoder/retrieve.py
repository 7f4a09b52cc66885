"""Counters for new arguments from a trained run: ``python -m biencoder.retrieve <run> --query "..." --corpus demo``.

The candidates are a split of a corpus (``--corpus demo|<root> --split test``) or the user's own file
(``--candidates file.txt|.jsonl|.csv``). Each query gets the run's own retrieve-then-rerank: the nearest
``max(k, the run's eval.k)`` candidates in the space it was selected with (its sim head, or the encoder's cosine
with ``eval.retrieve=encoder``), reordered by the pair classifier's logit margin; the top k are printed with both
scores. A candidate whose text equals the query is never returned for it.

Candidate embeddings are computed once per collection and kept in the embedding cache (``--cache-dir``, default
``trainer.cache_dir``'s ``~/.cache/biencoder``), keyed on the encoder's weights, tokenizer, pooling and length:
the second search against the same collection reads them back. This module is the command: it reads the inputs and
prints the hits of :class:`biencoder.engine.inference.retriever.Retriever`, which is the Python interface.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from .engine.data.corpus import read_corpus, split_name
from .engine.files import strict_json
from .engine.inference.retriever import DEFAULT_CACHE, Candidates, EncodingSettings, InputError, Retriever
from .errors import command


# -- reading inputs ----------------------------------------------------------------------------------------------
def _read_text(path: Path, what: str) -> str:
    try:
        return path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise InputError(f"{what} '{path}' does not exist: check the path") from None
    except UnicodeDecodeError as err:
        raise InputError(f"{what} '{path}' is not UTF-8 (byte {err.start}): save it as UTF-8") from None
    except OSError as err:
        raise InputError(f"{what} '{path}' cannot be read ({err.strerror}): check the path") from None


def read_texts(
    path: str | Path, what: str = "--candidates", text_column: str = "text", id_column: str | None = None
) -> tuple[list[str], list[str]]:
    """(texts, ids) from plain text (one per line), JSONL (``text_column``, optional ``id_column``) or CSV (the same
    columns). Blank lines are skipped; ids default to the line number (1-based) of each text."""
    path = Path(path)
    content = _read_text(path, what)
    texts, ids = [], []
    if path.suffix.lower() in (".jsonl", ".json"):
        for number, line in enumerate(content.splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                raise InputError(f"{what} '{path}' line {number} is not JSON: one object per line") from None
            if not isinstance(record, dict) or text_column not in record:
                raise InputError(
                    f"{what} '{path}' line {number} has no '{text_column}' field: name the field with --text-column"
                )
            if not isinstance(record[text_column], str):  # null, a number, a list: not a text ("None" is no query)
                raise InputError(
                    f"{what} '{path}' line {number}: '{text_column}' is "
                    f"{json.dumps(record[text_column])[:40]}, not a string"
                )
            texts.append(record[text_column])
            ids.append(str(record.get(id_column or "id", number)))
    elif path.suffix.lower() == ".csv":
        rows = list(csv.DictReader(content.splitlines()))
        columns = list(rows[0]) if rows else []
        for column in filter(None, (text_column, id_column)):
            if rows and column not in columns:
                raise InputError(
                    f"{what} '{path}' has no column '{column}' (columns: {', '.join(columns)}): "
                    "name it with --text-column / --id-column"
                )
        for number, row in enumerate(rows, 2):
            if (row.get(text_column) or "").strip():
                texts.append(row[text_column])
                ids.append(str(row[id_column]) if id_column else str(row.get("id") or number))
    else:
        for number, line in enumerate(content.splitlines(), 1):
            if line.strip():
                texts.append(line.strip())
                ids.append(str(number))
    if not texts:
        raise InputError(
            f"{what} '{path}' holds no texts: one per line (.txt), a '{text_column}' field (.jsonl) or column (.csv)"
        )
    return texts, ids


def corpus_candidates(root: str, split: str) -> tuple[list[str], list[str]]:
    """The arguments of a corpus split that belong to pairs (the per-epoch pool), ids ``<pair id>/<point|counter>``."""
    paired = read_corpus(root).paired(split_name(split))
    return paired.texts, [f"{p}/{k}" for p, k in zip(paired.table["pair_id"], paired.table["kind"], strict=True)]


def _short(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m biencoder.retrieve",
        description="Retrieve counter-arguments for new arguments with a trained run (retrieve, then rerank).",
    )
    parser.add_argument("run", help="a run folder of biencoder.train (or its best.pt)")
    parser.add_argument("--query", action="append", default=[], help="a query argument (repeatable)")
    parser.add_argument(
        "--queries",
        type=Path,
        help="queries: .txt (one per line) or .jsonl ('text' field); "
        "without --query/--queries they are read from stdin",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--corpus", help="candidates from a corpus: 'demo' or a corpus root (with --split)")
    source.add_argument("--candidates", type=Path, help="candidates from a file: .txt, .jsonl or .csv")
    parser.add_argument("--split", default="test", help="the corpus split (train, val, test)")
    parser.add_argument("--text-column", default="text", help="the text field/column of .jsonl/.csv files")
    parser.add_argument("--id-column", help="the id field/column (default: 'id' if present, else the line number)")
    parser.add_argument("-k", type=int, default=5, help="candidates per query (default 5)")
    parser.add_argument("--json", action="store_true", help="one JSON document with every query's results")
    parser.add_argument("--jsonl", action="store_true", help="one JSON line per query")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--cache-dir", default=DEFAULT_CACHE, help="embedding cache (default %(default)s)")
    parser.add_argument("--no-cache", action="store_true", help="embed the candidates without the cache")
    parser.add_argument("--width", type=int, default=100, help="text width in the terminal table")
    return parser


def _queries(args: argparse.Namespace) -> list[str]:
    """The query texts of --query, --queries or stdin; :class:`InputError` for none or an empty one."""
    queries = list(args.query)
    if args.queries is not None:
        queries += read_texts(args.queries, "--queries")[0]
    if not args.query and args.queries is None:
        if sys.stdin.isatty():
            raise InputError('no query: pass --query "text", --queries FILE, or pipe queries on stdin')
        queries = [line.strip() for line in sys.stdin.read().splitlines() if line.strip()]
    if not queries or any(not q.strip() for q in queries):
        raise InputError("an empty query: every query needs some text")
    return queries


@command
def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.k < 1:
        raise InputError(f"-k {args.k} is not valid: ask for at least 1 candidate")
    queries = _queries(args)
    if args.corpus is not None:
        texts, ids = corpus_candidates(args.corpus, args.split)
    else:
        texts, ids = read_texts(args.candidates, "--candidates", args.text_column, args.id_column)
    start = time.time()
    encoding = EncodingSettings(args.device, None if args.no_cache else args.cache_dir)
    retriever = Retriever(args.run, Candidates(texts, ids), encoding)
    loaded = time.time() - start
    start = time.time()
    results = retriever.search(queries, args.k)
    searched = time.time() - start
    records = [{"query": q, "hits": [asdict(h) for h in hits]} for q, hits in zip(queries, results, strict=True)]
    if args.json:
        print(strict_json(records, indent=2, ensure_ascii=False))
    elif args.jsonl:
        for record in records:
            print(strict_json(record, ensure_ascii=False))
    else:
        for record in records:
            print(f"\nquery: {_short(record['query'], args.width)}")
            print(f"{'rank':>4}  {'rerank':>7}  {'dist':>6}  {'id':<28}  text")
            for h in record["hits"]:
                print(
                    f"{h['rank']:>4}  {h['rerank_score']:>7.2f}  {h['retrieval_distance']:>6.3f}  "
                    f"{_short(h['id'], 28):<28}  {_short(h['text'], args.width)}"
                )
        print(
            f"\n{len(texts)} candidates ({retriever.space} retrieval, classifier rerank): model and candidate "
            f"embeddings {loaded:.1f} s (of which embedding {retriever.embed_seconds:.1f} s), "
            f"{len(queries)} quer{'y' if len(queries) == 1 else 'ies'} {1000 * searched:.0f} ms",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
