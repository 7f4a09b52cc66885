"""The paired splits a run trains and evaluates on, whichever reader made them: :class:`PairedSplit` (queries, their
true positives, the candidate pool rule), the split names, and which test queries a run has seen.

The readers build these objects: :mod:`.corpus` from the ArguAna folders (a point and its counter), :mod:`.pair_files`
from pair files (an anchor and its positive), both as a :class:`PairedSplit`; :mod:`.beir` from a BEIR folder (a
query, its relevant documents, the corpus as candidates) as a :class:`~.judged.JudgedSplit`. Everything downstream
(mining, training, the per-epoch top-1, the baselines, the seen/unseen split) reads only these, through the methods
both have: :meth:`~PairedSplit.is_candidate`, :meth:`~PairedSplit.is_relevant`, :attr:`~PairedSplit.relevant_pairs`,
:meth:`~PairedSplit.judgements`, :attr:`~PairedSplit.negative_rows`, :meth:`~PairedSplit.search_extra` and
:meth:`~PairedSplit.seen_in`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..config.schema import POOLS, DataSchema
from .arguana import CorpusError

#: the names printed everywhere (logs, metrics, tables, JSON) -> the corpus's folder names; either is accepted
SPLIT_NAMES = {"train": "training", "val": "validation", "test": "test"}


def split_name(name: str) -> str:
    """The printed name (``train``/``val``/``test``) of a split given in either spelling (``validation`` too)."""
    for short, folder in SPLIT_NAMES.items():
        if name in (short, folder):
            return short
    raise CorpusError(
        f"unknown split '{name}': use one of "
        + ", ".join(f"{short} (or {folder})" if short != folder else short for short, folder in SPLIT_NAMES.items())
    )


def dedup_keep(pairs_of, texts_of, columns: tuple[str, str]) -> dict[str, pd.Series]:
    """The deduplication rule, one definition for every reader (``data.dedup``), in the order test → val → train:
    test is untouched; val keeps the pairs neither of whose texts occurs in test; train keeps those neither of whose
    texts occurs in val or test. ``pairs_of(split)``: that split's pairs; ``texts_of(split)``: every text of it;
    ``columns``: the two text columns of a pair. Returns {"train": keep mask, "val": keep mask}."""

    def keep(split: str, banned: set[str]) -> pd.Series:
        pairs = pairs_of(split)
        return ~(pairs[columns[0]].isin(banned) | pairs[columns[1]].isin(banned))

    test, val = texts_of("test"), texts_of("val")
    return {"train": keep("train", test | val), "val": keep("val", test)}


#: what each ``data.pool`` puts in a query's candidate pool, for summaries
POOL_TEXT = {
    "all": "every point/anchor and counter/positive of the split but the query itself",
    "positives": "the counters/positives of the split only",
}


@dataclass(frozen=True)
class PairedSplit:
    """The query → positive pairs of one split, in a fixed order.

    ``table`` has 2·Q rows: row ``i`` (i < Q) is the query (ArguAna: the point) of pair ``i`` and row ``Q + i`` is its
    true positive (the counter). Columns: kind, text, text_id (equal texts share an id), pair_id; ArguAna's also theme,
    debate, stance (the 8 tasks need them); pair files' also ``group`` when they have one.
    ``query[i] = i`` and ``counter[i] = Q + i`` are kept explicit so callers never rely on the layout.

    ``pool`` (``data.pool``): ``all`` (every row can be a candidate) or ``positives`` (only the Q positive rows).
    ``negatives``: given negatives of the training pairs (pair files' ``negative`` column), one row per pair and
    negative, columns ``pair`` (index of the pair) and ``text``; None or empty when there are none. They are training
    rows ``2Q + j`` beyond the table (:attr:`extra_texts`), never candidates.
    """

    name: str
    table: pd.DataFrame
    pool: str = DataSchema.pool
    negatives: pd.DataFrame | None = None

    def __post_init__(self):
        if self.pool not in POOLS:
            raise ValueError(f"pool {self.pool!r} is not one of {POOLS}")

    @property
    def n_pairs(self) -> int:
        return len(self.table) // 2

    @property
    def query(self) -> np.ndarray:
        """[Q] row of each pair's point."""
        return np.arange(self.n_pairs)

    @property
    def counter(self) -> np.ndarray:
        """[Q] row of each pair's counter."""
        return np.arange(self.n_pairs, 2 * self.n_pairs)

    @property
    def texts(self) -> list[str]:
        return self.table["text"].tolist()

    @property
    def text_id(self) -> np.ndarray:
        """[2Q] integer id per row; rows with identical text share it."""
        return self.table["text_id"].to_numpy()

    @property
    def is_counter(self) -> np.ndarray:
        """[2Q] bool, True for counter (positive) rows: the second half of the table."""
        return np.arange(len(self.table)) >= self.n_pairs

    @property
    def pool_rows(self) -> np.ndarray:
        """The rows any query's pool draws from, ascending: every row (``all``) or the positives (``positives``)."""
        return np.arange(len(self.table)) if self.pool == "all" else self.counter

    @property
    def supports_tasks(self) -> bool:
        """Whether the 8 official tasks can run: they type candidates by ArguAna's theme, debate and stance."""
        return {"theme", "debate", "stance"} <= set(self.table.columns)

    @property
    def groups(self) -> np.ndarray | None:
        """[2Q] integer group code per row (a pair's query and positive share their row's group), or None."""
        if "group" not in self.table.columns:
            return None
        return pd.factorize(self.table["group"])[0]

    def twins_of_true_counter(self) -> np.ndarray:
        """[Q] how many *other* counters share each query's true-counter text (0 for most)."""
        counts = np.bincount(self.text_id[self.is_counter], minlength=len(self.table))
        return counts[self.text_id[self.counter]] - 1

    def is_relevant(self, rows: np.ndarray, pairs: np.ndarray | None = None) -> np.ndarray:
        """[P, K] bool for table rows [P, K] (one row of rows per query of ``pairs``, default all): the row is a
        relevant document of its query; here its true counter (:attr:`counter`), the one true row a query has."""
        pairs = np.arange(self.n_pairs) if pairs is None else np.asarray(pairs)
        return np.asarray(rows) == self.counter[pairs][:, None]

    @property
    def relevant_pairs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(pair [R], row [R], grade [R]): every (query, relevant row) with its grade, by query: what a run trains on
        (one triplet each) and what a graded metric reads (:attr:`qrels`). Here each query and its counter, grade 1."""
        pairs = np.arange(self.n_pairs)
        return pairs, self.counter, np.ones(self.n_pairs, dtype=np.int64)

    def judgements(self, pairs: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(rows [P, R], grade [P, R]): the relevant rows of each query of ``pairs`` (default all) and their grades,
        in :attr:`relevant_pairs`' order, R the most any of them has; a query with fewer is padded with row -1 and
        grade 0. Here [P, 1]: each query's counter, grade 1."""
        pairs = np.arange(self.n_pairs) if pairs is None else np.asarray(pairs)
        pair, row, grade = self.relevant_pairs
        start = np.searchsorted(pair, pairs)
        count = np.searchsorted(pair, pairs, side="right") - start
        width = np.arange(max(int(count.max(initial=0)), 1))
        valid = width < count[:, None]
        take = np.minimum(start[:, None] + width, max(len(row) - 1, 0))
        return np.where(valid, row[take], -1), np.where(valid, grade[take], 0)

    @property
    def qrels(self) -> dict[int, dict[int, int]]:
        """{query (index of the pair): {table row: grade}}: the relevance judgements of :attr:`relevant_pairs` as a
        mapping a metric of ranked rows takes (grades > 0 only)."""
        out: dict[int, dict[int, int]] = {}
        for pair, row, grade in zip(*self.relevant_pairs, strict=True):
            out.setdefault(int(pair), {})[int(row)] = int(grade)
        return out

    @property
    def negative_rows(self) -> np.ndarray:
        """The rows mining may draw a negative from, ascending: every row, points and counters, whatever the pool."""
        return np.arange(len(self.table))

    def banned_texts(self) -> np.ndarray:
        """[Q, M] text ids a query's mined negative must not have (-1 pads): here its point's and its counter's."""
        return np.stack([self.text_id[self.query], self.text_id[self.counter]], axis=1)

    def suspect_rows(self, pairs: np.ndarray) -> np.ndarray:
        """[P, M] rows that include every row :meth:`is_candidate` rejects for the queries ``pairs`` (-1 padding): the
        query itself and every row with a relevant document's text (the twins of its true counter)."""
        relevant, _ = self.judgements(pairs)
        texts = np.where(relevant >= 0, self.text_id[relevant.clip(0)], -1)
        return np.concatenate([self.query[pairs][:, None], rows_of_texts(self.text_id, texts)], 1)

    def search_extra(self) -> int:
        """The most rows a nearest-neighbour search over :attr:`pool_rows` can return for one query that
        :meth:`is_candidate` then drops: the query itself (``pool=all``) and the twins of its true counter."""
        return int(self.pool == "all") + int(self.twins_of_true_counter().max(initial=0))

    def seen_in(self, used: list[PairedSplit]) -> np.ndarray:
        """[Q] bool: the query's point or counter text occurs among the texts of the pairs in ``used`` (the training
        and validation pairs a run actually used). False everywhere after deduplication."""
        texts = set().union(*(set(u.texts) for u in used)) if used else set()
        t = self.table["text"].to_numpy()
        return np.array(
            [(t[p] in texts) or (t[c] in texts) for p, c in zip(self.query, self.counter, strict=True)], dtype=bool
        )

    def is_candidate(self, rows: np.ndarray, pairs: np.ndarray | None = None) -> np.ndarray:
        """[P, K] bool for table rows [P, K]: one row of candidates per query, for the pairs ``pairs`` (indices
        into the split's pairs; default all, in order).

        False for the query itself, for counters whose text equals the query's true counter's text, except the true
        counter, and (``pool=positives``) for every query row: the protocol's pool rule, shared by the per-epoch
        evaluation, the baselines and the 8 tasks.
        """
        rows = np.asarray(rows)
        pairs = np.arange(self.n_pairs) if pairs is None else np.asarray(pairs)
        text, true = self.text_id, self.counter[pairs][:, None]
        twin = self.is_counter[rows] & (text[rows] == text[true]) & (rows != true)
        keep = (rows != self.query[pairs][:, None]) & ~twin
        return keep if self.pool == "all" else keep & self.is_counter[rows]

    # -- given negatives (training only) --------------------------------------------------------------------------
    @property
    def extra_texts(self) -> list[str]:
        """The distinct given-negative texts, in order of first appearance: training rows ``2Q``, ``2Q + 1``, ..."""
        if self.negatives is None or not len(self.negatives):
            return []
        return pd.unique(self.negatives["text"]).tolist()

    @property
    def training_text_id(self) -> np.ndarray:
        """[2Q + E] text ids of the table's rows, then of :attr:`extra_texts` (a given negative that repeats a table
        text shares its id, so the loss treats them as the same text)."""
        if not self.extra_texts:
            return self.text_id
        return pd.factorize(pd.concat([self.table["text"], pd.Series(self.extra_texts)], ignore_index=True))[0]

    @property
    def given_triplets(self) -> np.ndarray:
        """[G, 3] training rows (query, true positive, given negative), one per given negative; [0, 3] for none."""
        if not self.extra_texts:
            return np.zeros((0, 3), dtype=np.int64)
        extra = {text: 2 * self.n_pairs + j for j, text in enumerate(self.extra_texts)}
        pair = self.negatives["pair"].to_numpy()
        return np.stack(
            [self.query[pair], self.counter[pair], self.negatives["text"].map(extra).to_numpy()], axis=1
        ).astype(np.int64)


def seen_queries(split: PairedSplit, used: list[PairedSplit]) -> np.ndarray:
    """[Q] bool: the test queries of ``split`` a run has seen in ``used`` (its training and validation splits), by the
    split's own rule (:meth:`PairedSplit.seen_in`): a pair's point or counter text among the pairs' texts; a judged
    query's text among the judged queries' texts. False everywhere after deduplication."""
    return split.seen_in(used)


def rows_of_texts(text_id: np.ndarray, texts: np.ndarray) -> np.ndarray:
    """[P, M] per row of ``texts`` [P, T] (text ids, -1: none) every row whose ``text_id`` is one of them, -1
    padding; M the most any row has (at least 1)."""
    by_text = np.argsort(text_id, kind="stable")
    ids = text_id[by_text]
    start = np.searchsorted(ids, texts)
    count = np.where(texts >= 0, np.searchsorted(ids, texts, side="right") - start, 0).ravel()
    offset = np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count)
    rows = by_text[np.repeat(start.ravel(), count) + offset]
    per_query = count.reshape(texts.shape).sum(1)
    place = np.arange(len(rows)) - np.repeat(np.cumsum(per_query) - per_query, per_query)
    out = np.full((len(texts), max(int(per_query.max(initial=0)), 1)), -1, dtype=np.int64)
    out[np.repeat(np.arange(len(texts)), per_query), place] = rows
    return out
