"""A run's test ranking as TREC files, so that trec_eval, ir-measures or ranx recompute its figures: ``test.run.gz``
(the final ranking of every test query at the best epoch, :func:`run_text`, gzipped) and ``test.qrels`` (what it was
judged by, :func:`qrels_text`), written beside ``final.json`` (:meth:`~biencoder.engine.runs.folder.RunFolder.finish`).

The contract of the two files (docs/protocol.md, "TREC files"):

* **Ids** (:func:`split_ids`) name the same query and document in every run on the same data, whatever its seed,
  cell or order of rows: a query is its pair's id in the split (ArguAna: ``<theme>/<debate>/<side><NN>``; pair files:
  ``<file>:line <n>``); a document is the id of the pair it belongs to, ``/``, and its kind (``point`` or
  ``counter``; ``anchor`` or ``positive``). Every row of the split is a candidate of its own, so two rows with one
  text (a point filed under two themes) are two documents, as they are two places in the per-epoch ranking: one
  id per text would let a tool merge them and move every later place. Whitespace and ``%`` in an id are written as
  ``%XX`` (UTF-8 bytes, as in a URL), so that an id is one field of a line.
* **Scores**: the document at place p (from 1) of a query's ranking has the score ``101 - p`` (:data:`FINAL_DEPTH`
  + 1 - p), an integer: strictly decreasing within a query, so a tool that sorts by score keeps this order and never
  needs its own rule for ties (trec_eval breaks them by document id).
* **Relevance**: each query's relevant documents with their grade, ``qid 0 docid grade``; ArguAna and pair files
  have one, its true counter (positive), grade 1. A counter with the true counter's text is the true counter to the
  per-epoch pool, which leaves it out, so it is in neither file.
"""

from __future__ import annotations

import numpy as np

from ..data.paired import PairedSplit
from ..retrieval.metrics import FINAL_DEPTH
from ..retrieval.order import NONE

#: what a run file and a qrels file of a run folder are called (the test split's, at the best epoch)
RUN_FILE, QRELS_FILE = "test.run.gz", "test.qrels"


def trec_id(name: str) -> str:
    """``name`` as one field of a TREC line: each whitespace character and ``%`` written as ``%XX`` of its UTF-8
    bytes, everything else as it is (so distinct names stay distinct)."""
    return "".join("".join(f"%{b:02X}" for b in c.encode()) if c.isspace() or c == "%" else c for c in name)


def split_ids(split: PairedSplit) -> tuple[list[str], list[str]]:
    """(query ids [Q], document ids [2Q]) of ``split``: pair ``i``'s query id, and the id of each row of its table
    (the module's contract). ValueError when two pairs share an id: tools would merge their lines."""
    pair_id, kind = split.table["pair_id"].tolist(), split.table["kind"].tolist()
    docs = [trec_id(f"{p}/{k}") for p, k in zip(pair_id, kind, strict=True)]
    if len(set(docs)) != len(docs):
        raise ValueError(f"split {split.name} has pairs with one id: a TREC file needs one id per query and document")
    return [trec_id(p) for p in pair_id[: split.n_pairs]], docs


def run_text(query_ids: list[str], doc_ids: list[str], rows: np.ndarray, tag: str) -> str:
    """A TREC run: ``qid Q0 docid rank score tag`` per place, the first :data:`FINAL_DEPTH` places of each query's
    ranking ``rows`` [P, d] (rows of ``doc_ids``, best first, :data:`NONE` past its end; ``query_ids`` [P]), scored
    ``FINAL_DEPTH + 1 - rank``; ``tag`` names the run (no whitespace)."""
    lines = []
    for qid, ranking in zip(query_ids, np.asarray(rows)[:, :FINAL_DEPTH].tolist(), strict=True):
        for place, row in enumerate(ranking, 1):
            if row != NONE:
                lines.append(f"{qid} Q0 {doc_ids[row]} {place} {FINAL_DEPTH + 1 - place} {tag}\n")
    return "".join(lines)


def qrels_text(query_ids: list[str], doc_ids: list[str], relevant: np.ndarray, grade: np.ndarray) -> str:
    """TREC qrels: ``qid 0 docid grade`` per relevant document: ``relevant`` [P, R] rows of ``doc_ids`` and their
    ``grade`` [P, R] (> 0; 0 marks the padding of a query with fewer than R) of the queries ``query_ids`` [P]."""
    lines = []
    for qid, rows, grades in zip(query_ids, np.asarray(relevant).tolist(), np.asarray(grade).tolist(), strict=True):
        lines.extend(f"{qid} 0 {doc_ids[row]} {g}\n" for row, g in zip(rows, grades, strict=True) if g > 0)
    return "".join(lines)


def ranking_files(split: PairedSplit, pairs: np.ndarray | None, rows: np.ndarray, tag: str) -> dict[str, str]:
    """{``test.run.gz``: ..., ``test.qrels``: ...} of the final rankings ``rows`` [P, d] of the queries ``pairs``
    (indices of pairs of ``split``; None: all) judged by their relevant documents and grades
    (:meth:`~biencoder.engine.data.paired.PairedSplit.judgements`: an ArguAna query's true counter, grade 1)."""
    pairs = np.arange(split.n_pairs) if pairs is None else np.asarray(pairs)
    queries, docs = split_ids(split)
    query_ids = [queries[p] for p in pairs.tolist()]
    return {
        RUN_FILE: run_text(query_ids, docs, rows, trec_id(tag)),
        QRELS_FILE: qrels_text(query_ids, docs, *split.judgements(pairs)),
    }
