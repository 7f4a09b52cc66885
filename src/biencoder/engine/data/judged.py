"""A split of queries judged against a collection of documents (a BEIR split, :mod:`.beir`): :class:`JudgedSplit`,
which every reader of a :class:`~.paired.PairedSplit` reads through the same methods."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .paired import PairedSplit, rows_of_texts

#: what a :class:`JudgedSplit`'s per-epoch pool holds, by ``data.pool`` (BEIR: queries are never candidates)
JUDGED_POOL_TEXT = {
    "all": "every document of the corpus but the query's own",
    "positives": "the documents relevant to a query of the split",
}


@dataclass(frozen=True, kw_only=True)
class JudgedSplit(PairedSplit):
    """Queries judged against a collection of documents (a BEIR split, :mod:`.beir`): a query may have several relevant
    documents, with grades, and the candidates are documents, never queries.

    ``table`` has Q + D rows: row ``i`` (i < Q) is query ``i``, rows Q.. are the documents (kind ``document``; every
    document of the corpus with ``data.pool=all``, those relevant to a query of the split with ``positives``: the
    reader decides, ``pool`` records which). Columns: kind, text, text_id (a query and a document with equal text
    share it), pair_id (the BEIR ``_id``).

    Args:
        n_queries: Q.
        relevance: (pair [R], row [R], grade [R]): every (query, relevant document row, grade > 0), by query, and
            within a query by grade (highest first), then as the qrels file lists them. A query's first one is its
            :attr:`counter`, the row the single-answer rules (:meth:`twins_of_true_counter`) read.
        own: [Q] the row of the document whose ``_id`` is the query's (BEIR's ``ignore_identical_ids``), -1 where none.

    A query's candidates (:meth:`is_candidate`) are the document rows but its own: a document with the query's id or
    text is never one, nor is a document that is not relevant to it but has the text of one that is (a duplicate of
    the answer is the answer, as for ArguAna's twins); a relevant document always is. Its rank is that of its first
    relevant document (:meth:`is_relevant`), so ``top1`` is the share of queries whose first document is relevant.
    """

    n_queries: int
    relevance: tuple[np.ndarray, np.ndarray, np.ndarray]
    own: np.ndarray

    @property
    def n_pairs(self) -> int:
        """Q, the queries (each one query of the per-epoch evaluation, whatever its relevant documents)."""
        return self.n_queries

    @cached_property
    def counter(self) -> np.ndarray:
        """[Q] each query's first relevant document row (highest grade, then qrels order)."""
        pair, row, _ = self.relevance
        return row[np.searchsorted(pair, np.arange(self.n_queries))]

    @property
    def pool_rows(self) -> np.ndarray:
        """The document rows, ascending: every query's pool draws from them, whatever ``pool`` made of them."""
        return np.arange(self.n_queries, len(self.table))

    @property
    def negative_rows(self) -> np.ndarray:
        """The document rows: mining draws negatives from the documents, never from the queries."""
        return self.pool_rows

    @property
    def relevant_pairs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.relevance

    @cached_property
    def _relevant_keys(self) -> np.ndarray:
        """Sorted ``pair · rows + row`` of every relevant (query, row)."""
        pair, row, _ = self.relevance
        return np.sort(pair * len(self.table) + row)

    @cached_property
    def _relevant_text_keys(self) -> np.ndarray:
        """Sorted ``pair · texts + text_id`` of every relevant (query, document text)."""
        pair, row, _ = self.relevance
        return np.unique(pair * (self.text_id.max() + 1) + self.text_id[row])

    def is_relevant(self, rows: np.ndarray, pairs: np.ndarray | None = None) -> np.ndarray:
        """[P, K] bool: the row is a document judged relevant (grade > 0) to its query; False for :data:`NONE`-like
        negative rows."""
        rows = np.asarray(rows)
        pairs = np.arange(self.n_pairs) if pairs is None else np.asarray(pairs)
        keys = pairs[:, None] * len(self.table) + rows
        return (rows >= 0) & np.isin(keys, self._relevant_keys)

    def is_candidate(self, rows: np.ndarray, pairs: np.ndarray | None = None) -> np.ndarray:
        """[P, K] bool for table rows [P, K] of the queries ``pairs`` (default all): a document row that is relevant
        to the query, or that is neither the query's own (its id or its text) nor a duplicate of a relevant one's
        text."""
        rows = np.asarray(rows)
        pairs = np.arange(self.n_pairs) if pairs is None else np.asarray(pairs)
        text = self.text_id[rows]
        relevant = self.is_relevant(rows, pairs)
        own = (text == self.text_id[self.query[pairs]][:, None]) | (rows == self.own[pairs][:, None])
        twin = np.isin(pairs[:, None] * (self.text_id.max() + 1) + text, self._relevant_text_keys)
        return (rows >= self.n_queries) & (relevant | ~(own | twin))

    def suspect_rows(self, pairs: np.ndarray) -> np.ndarray:
        """:meth:`PairedSplit.suspect_rows`, the documents with the query's text and its own document."""
        pairs = np.asarray(pairs)
        own_text = rows_of_texts(self.text_id, self.text_id[self.query[pairs]][:, None])
        return np.concatenate([super().suspect_rows(pairs), own_text, self.own[pairs][:, None]], 1)

    def search_extra(self) -> int:
        """An upper bound of the documents one query's search can return that :meth:`is_candidate` drops: those with
        the query's text, its own document, the other documents with a relevant document's text."""
        if self.n_queries == 0:
            return 0
        n_texts = self.text_id.max() + 1
        per_text = np.bincount(self.text_id[self.pool_rows], minlength=n_texts)
        pair, _, _ = self.relevance
        keys = self._relevant_text_keys
        texts_per_query = np.bincount(keys // n_texts, per_text[keys % n_texts], minlength=self.n_queries)
        twins = texts_per_query - np.bincount(pair, minlength=self.n_queries)
        own = per_text[self.text_id[self.query]] + 1
        return int((own + twins).max())

    def banned_texts(self) -> np.ndarray:
        """[Q, M] text ids a query's mined negative must not have, -1 padding: the query's, its own document's, and
        those of every document relevant to it (mining never picks a relevant document, nor a copy of one)."""
        pair, row, _ = self.relevance
        per_query = np.bincount(pair, minlength=self.n_queries)
        out = np.full((self.n_queries, 2 + int(per_query.max(initial=0))), -1, dtype=np.int64)
        out[:, 0] = self.text_id[self.query]
        has_own = self.own >= 0
        out[has_own, 1] = self.text_id[self.own[has_own]]
        place = np.arange(len(pair)) - np.repeat(np.cumsum(per_query) - per_query, per_query)
        out[pair, 2 + place] = self.text_id[row]
        return out

    def seen_in(self, used: list[PairedSplit]) -> np.ndarray:
        """[Q] bool: the query's text occurs among the queries of ``used`` (the training and dev queries a run used);
        documents never make a query seen: every split shares the corpus."""
        texts = set().union(*(set(u.texts[: u.n_pairs]) for u in used)) if used else set()
        return np.array([t in texts for t in self.texts[: self.n_queries]], dtype=bool)
