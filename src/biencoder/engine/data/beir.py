"""BEIR-layout data (``data=beir data.root=<folder>``; docs/own-data.md): a corpus, queries and graded judgements.

The folder holds ``corpus.jsonl`` (one ``{"_id", "title", "text"}`` per document), ``queries.jsonl`` (one ``{"_id",
"text"}`` per query) and ``qrels/train.tsv``, ``qrels/dev.tsv``, ``qrels/test.tsv`` (tab-separated, a header row, then
``query-id``, ``corpus-id``, ``score``). A split without its qrels file is absent, as in BEIR (a run needs all three:
:meth:`BeirData.paired` says which file is missing). A document's text is its title and its text joined by a space (the
text alone when the title is empty); texts lose the whitespace at their ends, as pair files' do.

:func:`read_beir` gives a :class:`BeirData`, which has the interface of the other readers' corpora (``used(dedup)``,
``deduplicated()``, ``overlap()``, ``paired(split, pool)``, ``counts``, ``dropped``, ``files``), so the runner reads it
alike. Its splits are :class:`~.judged.JudgedSplit`: every query judged (a score > 0) relevant to at least one
document, each (query, relevant document) a training pair, the corpus the candidates of every split (``data.pool=all``;
``positives``: the documents relevant to a query of the split), the grades kept for a graded metric. Judgements with
score 0 or less are read and dropped (BEIR's "not relevant"); a query judged only so is left out.

What cannot be used is a :class:`BeirError`: one line naming the file, the line and the fix; nothing is written.
:func:`.beir_export.export_beir` writes an ArguAna corpus in this layout.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from ..config.packaged import beir_demo
from ..config.schema import DataSchema
from .arguana import CorpusError
from .judged import JudgedSplit
from .pair_records import BEIR_FILES, beir_files
from .paired import SPLIT_NAMES, split_name

#: the qrels file of each split, as BEIR names them (``dev`` is the validation split)
QRELS = {name: BEIR_FILES[name].removeprefix("qrels/") for name in SPLIT_NAMES}
QRELS_HEADER = ("query-id", "corpus-id", "score")


class BeirError(CorpusError):
    """A BEIR folder that cannot be used; the message names the file, the line, and the fix."""


# -- reading ------------------------------------------------------------------------------------------------------
def _jsonl(path: Path, fields: tuple[str, ...], what: str) -> pd.DataFrame:
    """The records of a JSON Lines file with ``_id`` and ``fields`` (strings; ``title`` may be missing), one per line;
    :class:`BeirError` for a missing file, a line that is not a JSON object, a missing or empty ``_id`` or text, a
    duplicate ``_id``, or no record at all."""
    if not path.is_file():
        raise BeirError(f"'{path}' is missing: a BEIR folder holds corpus.jsonl, queries.jsonl and qrels/<split>.tsv")
    rows, seen = [], {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise BeirError(f"'{path}' is not UTF-8 text (byte {err.start}): save it as UTF-8") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"'{path}' line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise BeirError(f"{where} is not JSON ({err.msg}): write one JSON object per line") from None
        if not isinstance(record, dict):
            raise BeirError(f'{where} is not a JSON object: write one {{"_id": ..., "text": ...}} per line')
        doc_id = record.get("_id")
        if isinstance(doc_id, int) and not isinstance(doc_id, bool):
            doc_id = str(doc_id)
        if not isinstance(doc_id, str) or not doc_id.strip():
            raise BeirError(f'{where} has no "_id": give every {what} a non-empty "_id" (a string)')
        if doc_id in seen:
            raise BeirError(f'{where}: "_id" {doc_id!r} is also line {seen[doc_id]}: give every {what} its own "_id"')
        seen[doc_id] = number
        values = {"_id": doc_id, "line": number}
        for name in fields:
            value = record.get(name, "" if name == "title" else None)
            if value is None and name == "title":
                value = ""
            if not isinstance(value, str):
                raise BeirError(f'{where} has no "{name}" string: give every {what} a "{name}" (a string)')
            values[name] = value.strip()
        if not " ".join(values[name] for name in fields if values[name]):
            raise BeirError(f"{where}: {what} {doc_id!r} has an empty text: give it a text, or drop the line")
        rows.append(values)
    if not rows:
        raise BeirError(f"'{path}' holds no {what}: write one JSON object per line")
    return pd.DataFrame(rows, columns=["_id", "line", *fields])


def _qrels(path: Path, queries: dict[str, int], docs: dict[str, int], queries_file: Path, corpus_file: Path):
    """The judgements of one qrels file: a DataFrame (query, doc: positions in the queries and the corpus; score, line)
    of the lines with a score > 0, in file order; :class:`BeirError` for a bad header or line, an unknown id, or a
    (query, document) judged twice."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise BeirError(f"'{path}' is not UTF-8 text (byte {err.start}): save it as UTF-8") from None
    lines = list(csv.reader(io.StringIO(text), delimiter="\t"))
    if not lines or tuple(c.strip() for c in lines[0]) != QRELS_HEADER:
        raise BeirError(f"'{path}' line 1 is not the header: start it with the row query-id<TAB>corpus-id<TAB>score")
    rows, seen = [], {}
    for number, cells in enumerate(lines[1:], 2):
        if not cells or not "".join(cells).strip():
            continue
        where = f"'{path}' line {number}"
        if len(cells) != 3:
            raise BeirError(f"{where} has {len(cells)} fields: write query-id<TAB>corpus-id<TAB>score")
        query, doc, score = (c.strip() for c in cells)
        try:
            grade = int(score)
        except ValueError:
            raise BeirError(
                f"{where}: score {score!r} is not an integer: write a whole number (0: not relevant)"
            ) from None
        if query not in queries:
            raise BeirError(f"{where}: query-id {query!r} is not in '{queries_file}': add it there, or drop the line")
        if doc not in docs:
            raise BeirError(f"{where}: corpus-id {doc!r} is not in '{corpus_file}': add it there, or drop the line")
        if (query, doc) in seen:
            raise BeirError(
                f"{where}: query {query!r} and document {doc!r} are also judged on line {seen[query, doc]}: "
                "keep one line per pair"
            )
        seen[query, doc] = number
        if grade > 0:
            rows.append((queries[query], docs[doc], grade, number))
    return pd.DataFrame(rows, columns=["query", "doc", "score", "line"])


def read_beir(root: str | Path) -> BeirData:
    """Read the BEIR folder ``root`` (``"beir_demo"``: the example shipped with the package) into a :class:`BeirData`
    with its official splits. Raises :class:`BeirError` on anything listed in the module docstring."""
    folder = Path(beir_demo() if str(root) == "beir_demo" else root).expanduser()
    if not folder.is_dir():
        raise BeirError(
            f"data.root='{folder}' is not a folder: point it at a BEIR folder (corpus.jsonl, queries.jsonl, "
            "qrels/), or use data=beir_demo"
        )
    corpus_file, queries_file = folder / "corpus.jsonl", folder / "queries.jsonl"
    corpus = _jsonl(corpus_file, ("title", "text"), "document")
    queries = _jsonl(queries_file, ("text",), "query")
    doc_at = {d: i for i, d in enumerate(corpus["_id"])}
    query_at = {q: i for i, q in enumerate(queries["_id"])}
    qrels = {}
    for name, file in QRELS.items():
        path = folder / "qrels" / file
        if path.is_file():
            qrels[name] = _qrels(path, query_at, doc_at, queries_file, corpus_file)
    if not qrels:
        raise BeirError(
            f"'{folder / 'qrels'}' holds none of {', '.join(QRELS.values())}: write the judgements of each split "
            "there (query-id<TAB>corpus-id<TAB>score, a header row)"
        )
    files = beir_files(folder)
    title = corpus["title"].to_numpy(dtype=object)
    text = corpus["text"].to_numpy(dtype=object)
    documents = pd.DataFrame(
        {"_id": corpus["_id"], "text": [f"{t} {x}" if t and x else (t or x) for t, x in zip(title, text, strict=True)]}
    )
    return BeirData(
        root=folder, documents=documents, queries=queries[["_id", "text"]], qrels=qrels, files=files, dropped={}
    )


# -- the folder as a corpus ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BeirData:
    """A BEIR folder read by :func:`read_beir`. ``documents``: ``_id``, text (title and text), in corpus order;
    ``queries``: ``_id``, text; ``qrels``: per present split (``train``/``val``/``test``), its judgements with a
    score > 0 (query and doc as positions in ``queries`` and ``documents``, score, line), in file order; ``files``:
    path, size and sha256 of each file read; ``dropped``: judged queries removed per split by :meth:`deduplicated`."""

    root: Path
    documents: pd.DataFrame
    queries: pd.DataFrame
    qrels: dict[str, pd.DataFrame]
    files: dict[str, dict] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)

    def _split(self, split: str) -> pd.DataFrame:
        name = split_name(split)
        if name not in self.qrels:
            raise BeirError(
                f"'{self.root / 'qrels' / QRELS[name]}' is missing, so the BEIR folder has no {name} split: a run "
                f"trains on train.tsv, selects on dev.tsv and reports test.tsv; write it (query-id<TAB>corpus-id"
                "<TAB>score, a header row)"
            )
        return self.qrels[name]

    def query_texts(self, split: str) -> set[str]:
        """The texts of the queries judged in ``split`` (none for an absent split)."""
        name = split_name(split)
        if name not in self.qrels:
            return set()
        return set(self.queries["text"].to_numpy()[pd.unique(self.qrels[name]["query"])])

    @property
    def counts(self) -> dict[str, dict[str, int]]:
        """Per present split: queries judged, judgements (score > 0), queries with several relevant documents,
        distinct relevant documents, graded judgements (score > 1), and the corpus's documents."""
        out = {}
        for name, q in self.qrels.items():
            per_query = q.groupby("query").size()
            out[name] = {
                "queries": int(q["query"].nunique()),
                "judgements": len(q),
                "multi_relevant_queries": int((per_query > 1).sum()),
                "relevant_documents": int(q["doc"].nunique()),
                "graded_judgements": int((q["score"] > 1).sum()),
                "corpus_documents": len(self.documents),
            }
        return out

    def deduplicated(self) -> BeirData:
        """The splits without their query overlap, in the order test → val → train: test is untouched; val drops the
        queries whose text is a test query's; train those whose text is a val or test query's (their judgements with
        them). The corpus is every split's, so documents are never dropped. ``dropped`` counts the queries."""
        texts = self.queries["text"].to_numpy()
        kept, dropped = dict(self.qrels), {name: 0 for name in self.qrels}
        for name, later in (("val", ("test",)), ("train", ("val", "test"))):
            if name not in self.qrels:
                continue
            banned = set().union(*(self.query_texts(s) for s in later))
            q = self.qrels[name]
            drop = pd.Series(texts[q["query"].to_numpy()], index=q.index).isin(banned)
            kept[name] = q[~drop]
            dropped[name] = int(q.loc[drop, "query"].nunique())
        return replace(self, qrels=kept, dropped=dropped)

    def used(self, dedup: bool) -> BeirData:
        """The judgements a run uses: :meth:`deduplicated` when ``dedup`` (``data.dedup``), else the files'."""
        return self.deduplicated() if dedup else self

    def overlap(self) -> dict[str, dict[str, int]]:
        """Per ordered pair of present splits ``a->b`` (and ``test->train+val``): the (query text, document)
        judgements of a also judged in b, and the distinct query texts of a that are queries of b."""
        texts = self.queries["text"].to_numpy()

        def judged(name: str) -> set[tuple[str, int]]:
            q = self.qrels[name]
            return set(zip(texts[q["query"].to_numpy()], q["doc"], strict=True))

        present = [s for s in SPLIT_NAMES if s in self.qrels]
        targets = [(a, (b,)) for a in present for b in present if a != b]
        if "test" in present and {"train", "val"} <= set(present):
            targets.append(("test", ("train", "val")))
        out = {}
        for a, bs in targets:
            pairs_b = set().union(*(judged(b) for b in bs))
            texts_b = set().union(*(self.query_texts(b) for b in bs))
            out[f"{a}->{'+'.join(bs)}"] = {
                "pairs": len(judged(a) & pairs_b),
                "of_pairs": len(judged(a)),
                "texts": len(self.query_texts(a) & texts_b),
                "of_texts": len(self.query_texts(a)),
            }
        return out

    def paired(self, split: str, pool: str = DataSchema.pool) -> JudgedSplit:
        """The :class:`~.judged.JudgedSplit` of ``split``: its judged queries (rows 0..Q-1, in order of first
        judgement), then the documents: the whole corpus in file order (``pool=all``), or those relevant to a query
        of the split in order of first judgement (``positives``). Relevance by query, highest grade first, then in
        file order."""
        name = split_name(split)
        q = self._split(name)
        if q.empty:
            raise BeirError(
                f"'{self.root / 'qrels' / QRELS[name]}' judges no document relevant (score > 0) to a query"
                + (
                    " once data.dedup dropped the queries a later split asks (data.dedup=false keeps them)"
                    if self.dropped.get(name)
                    else ""
                )
                + ": a split needs judgements"
            )
        query_ids = pd.unique(q["query"])
        docs = np.arange(len(self.documents)) if pool == "all" else pd.unique(q["doc"])
        n = len(query_ids)
        query_row = pd.Series(np.arange(n), index=query_ids)
        doc_row = pd.Series(n + np.arange(len(docs)), index=docs)
        rel = pd.DataFrame(
            {"pair": query_row[q["query"]].to_numpy(), "row": doc_row[q["doc"]].to_numpy(), "grade": q["score"]}
        )
        rel["order"] = np.arange(len(rel))
        rel = rel.sort_values(["pair", "grade", "order"], ascending=[True, False, True], kind="stable")
        queries = self.queries.iloc[query_ids]
        documents = self.documents.iloc[docs]
        table = pd.DataFrame(
            {
                "kind": ["query"] * n + ["document"] * len(docs),
                "text": np.concatenate([queries["text"].to_numpy(), documents["text"].to_numpy()]),
                "pair_id": np.concatenate([queries["_id"].to_numpy(), documents["_id"].to_numpy()]),
            }
        )
        table["text_id"] = pd.factorize(table["text"])[0]
        own = pd.Series(doc_row.to_numpy(), index=self.documents["_id"].to_numpy()[docs])
        own_row = own.reindex(queries["_id"].to_numpy()).fillna(-1).to_numpy(dtype=np.int64)
        relevance = tuple(rel[c].to_numpy(dtype=np.int64) for c in ("pair", "row", "grade"))
        return JudgedSplit(name=name, table=table, pool=pool, n_queries=n, relevance=relevance, own=own_row)
