"""Counters for new arguments from a trained run: ``python -m biencoder.retrieve <run> --query "..." --corpus demo``.

The candidates are a split of a corpus (``--corpus demo|<root> --split test``) or the user's own file
(``--candidates file.txt|.jsonl|.csv``). Each query gets the run's own retrieve-then-rerank: the nearest
``max(k, the run's eval.k)`` candidates in the space it was selected with (its sim head, or the encoder's cosine
with ``eval.retrieve=encoder``), reordered by the pair classifier's logit margin; the top k are printed with both
scores. A candidate whose text equals the query is never returned for it.

Candidate embeddings are computed once per collection and kept in the embedding cache (``--cache-dir``, default
``trainer.cache_dir``'s ``~/.cache/biencoder``), keyed on the encoder's weights, tokenizer, pooling and length:
the second search against the same collection reads them back. In Python::

    from biencoder.retrieve import Retriever
    retriever = Retriever("logs/runs/<run>", candidates=["text", ...], ids=["a", ...])
    for hit in retriever.search(["my argument"], k=5)[0]:
        print(hit.rank, hit.id, hit.rerank_score, hit.text)
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from .engine.config.schema import default_cache_dir
from .engine.data.corpus import read_corpus, split_name
from .engine.files import strict_json
from .engine.modeling.encoding import Encoding, TextEncoder, embed_pooled, pooled_vectors
from .engine.modeling.model import Embeddings
from .engine.retrieval.rerank import NONE, first_kept, shortlist_margins
from .engine.retrieval.search import NeighbourIndex
from .engine.runs.checkpoint import load_checkpoint
from .errors import BiencoderError, command

DEFAULT_CACHE = default_cache_dir()  # the one definition, trainer.cache_dir's default too


class InputError(BiencoderError, ValueError):
    """A query or candidate input that cannot be used; the message names it and the fix."""


@dataclass
class Hit:
    rank: int
    id: str
    text: str
    retrieval_distance: float  # in the retrieve space (smaller = nearer)
    rerank_score: float  # classifier logit margin l1 - l0 (higher = more likely the counter)


class Retriever:
    """A trained run, loaded once, over a fixed candidate collection whose embeddings are computed once.

    Args:
        run: a run folder of ``biencoder.train`` or its ``best.pt``.
        candidates: the candidate texts; ``ids`` (default "0", "1", ...) name them in the results.
        device: ``cpu`` or ``cuda``; ``cache_dir``: the embedding cache (None: no cache).
    """

    def __init__(
        self,
        run: str | Path,
        candidates: list[str],
        ids: list[str] | None = None,
        device: str = "cpu",
        cache_dir: str | Path | None = DEFAULT_CACHE,
        batch_size: int = 64,
        progress: bool = False,
    ):
        if not candidates:
            raise InputError("no candidate texts: pass a non-empty collection")
        self.model, self.tokenizer, self.model_cfg, self.settings = load_checkpoint(run, progress, what="run")
        self.device = torch.device(device)
        self.model.to(self.device)
        self.texts = list(candidates)
        self.copies = Counter(self.texts)  # text -> how many candidates have it (0 for any other text)
        self.ids = [str(i) for i in (ids if ids is not None else range(len(self.texts)))]
        self.space = self.settings["retrieve"]
        self.batch_size = batch_size
        start = time.time()
        pooled = self._pool(self.texts, cache_dir, progress, "encode candidates")
        self.candidates = embed_pooled(self.model, pooled, device=self.device)
        self.index = NeighbourIndex(
            self.candidates.retrieval(self.space).numpy().astype(np.float64), "exact", self.device
        )
        self.embed_seconds = time.time() - start

    def _pool(self, texts: list[str], cache_dir=None, progress: bool = False, desc: str = "encode") -> torch.Tensor:
        encoding = Encoding(self.batch_size, self.device, progress=progress)
        encoder = TextEncoder(self.model, self.tokenizer, self.model_cfg["max_length"], encoding, cache_dir)
        return pooled_vectors(encoder, texts, desc)

    def search(self, queries: list[str], k: int = 5) -> list[list[Hit]]:
        """Top ``k`` candidates per query, best first (see the module docstring): k hits whenever k candidates have a
        text other than the query's, however many copies of the query's text the collection holds."""
        if any(not q.strip() for q in queries):
            raise InputError("an empty query: every query needs some text")
        k = min(k, len(self.texts))
        shortlist = max(k, int(self.settings["k"]))
        q = embed_pooled(self.model, self._pool(queries), device=self.device)
        # as many neighbours more than the shortlist as the collection holds copies of a query's text: those are
        # never returned for it, so at most that many are dropped and the shortlist stays full whenever it can be
        copies = max((self.copies[query] for query in queries), default=0)
        dist, rows = self.index.query(q.retrieval(self.space).numpy().astype(np.float64), shortlist + copies)
        keep = np.array([[self.texts[r] != query for r in row] for row, query in zip(rows, queries)])
        rows, dist = first_kept(rows, dist, keep, shortlist)
        # the queries are rows 0..n-1 of the pairs' embeddings, the candidates follow them
        both = Embeddings(torch.cat([q.sim, self.candidates.sim]), torch.cat([q.pooled, self.candidates.pooled]))
        n = len(queries)
        [margins] = shortlist_margins(
            self.model, both, np.arange(n), [np.where(rows == NONE, NONE, n + rows)], device=self.device
        )
        results = []
        for i in range(n):
            listed = np.flatnonzero(rows[i] != NONE)
            order = sorted(listed, key=lambda j: (-margins[i, j], dist[i, j]))[:k]
            results.append(
                [
                    Hit(
                        rank + 1, self.ids[rows[i, j]], self.texts[rows[i, j]], float(dist[i, j]), float(margins[i, j])
                    )
                    for rank, j in enumerate(order)
                ]
            )
        return results


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
    return paired.texts, [f"{p}/{k}" for p, k in zip(paired.table["pair_id"], paired.table["kind"])]


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
    retriever = Retriever(args.run, texts, ids, args.device, None if args.no_cache else args.cache_dir)
    loaded = time.time() - start
    start = time.time()
    results = retriever.search(queries, args.k)
    searched = time.time() - start
    records = [{"query": q, "hits": [asdict(h) for h in hits]} for q, hits in zip(queries, results)]
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
