"""The MTEB/BEIR ArguAna protocol (``eval.protocol=mteb``; docs/protocol.md, "The MTEB protocol"): each point of a
split that has a counter is a query, every distinct argument text of the whole corpus (all three splits, the arguments
without their other half too) is a candidate, the query's own text is never one, and its counter is its one relevant
document; nDCG@10 is the headline.

:class:`CorpusQueries` holds the candidates as rows of one table (one row per distinct text) and each query's own and
relevant rows in it. It has the parts of :class:`~biencoder.engine.data.paired.PairedSplit` that the 8 tasks' scorers
and rankers read (``n_pairs``, ``table``, ``texts``, ``query``, ``counter``, ``name``), so :func:`protocol_ranks`
ranks with the same code as they do: :func:`~.official_tasks.block_ranks` over the scores of ``encoder_cosine``,
``tfidf``, ``sim`` or ``classifier`` (:func:`~.official_tasks.scorer_of`), and :func:`~.pools.pool_ranks` for
``rerank`` (a run's final ranking: the k nearest in its retrieval space reordered by its classifier, then the rest by
distance). Every candidate of a query is ranked, so the ranks are known to the last place (``Ranks(depth=None)``), and
a candidate that ties the relevant document ranks above it. The numbers are :mod:`.metrics`'
(:func:`protocol_metrics`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..data.arguana import CorpusError
from ..data.corpus import Corpus
from ..modeling.model import BiModel, Embeddings
from .metrics import Ranks, mrr, mrr_at, ndcg_at, recall_at, top1
from .official_tasks import block_ranks, scorer_of
from .pools import pool_ranks
from .rerank import SCHEMA_RERANK, Rerank

#: the pool's name in :func:`~.official_tasks.block_ranks` / :func:`~.pools.pool_ranks` (one pool per query)
POOL = "corpus"


@dataclass(frozen=True)
class CorpusQueries:
    """The queries of one split against the candidates of a whole corpus.

    Attributes:
        name: the split the queries come from (``test``: MTEB's ArguAna task).
        table: one row per candidate, column ``text``: every distinct argument text of the corpus, in file order (the
            first file with the text).
        query: [Q] the row of each query's own text (never its candidate).
        counter: [Q] the row of each query's relevant document (its counter's text).
        query_ids: [Q] each query's pair id (``<theme>/<debate>/<side><NN>``), the order of ``query``.
    """

    name: str
    table: pd.DataFrame
    query: np.ndarray
    counter: np.ndarray
    query_ids: tuple[str, ...]

    @property
    def n_pairs(self) -> int:
        """Q, the number of queries (the name :func:`~.official_tasks.block_ranks` reads)."""
        return len(self.query)

    @property
    def texts(self) -> list[str]:
        """The candidates' texts, one per row of :attr:`table`."""
        return self.table["text"].tolist()

    def false_candidates(self, pairs: np.ndarray) -> np.ndarray:
        """[B, N] bool: the candidates of the queries ``pairs`` (indices into :attr:`query`) other than their relevant
        document: every row but the query's own text and its counter's."""
        pairs = np.asarray(pairs)
        mask = np.ones((len(pairs), len(self.table)), dtype=bool)
        at = np.arange(len(pairs))
        mask[at, self.query[pairs]] = False
        mask[at, self.counter[pairs]] = False
        return mask


def corpus_queries(corpus: Corpus, split: str, max_debates: int | None) -> CorpusQueries:
    """The MTEB protocol's queries and candidates of ``corpus`` (as read from disk: the official splits, since the
    candidates are every text of every split whatever ``data.dedup`` says): the points of ``split`` that have a
    counter (of its first ``max_debates`` debates, :meth:`Corpus.paired`) against every distinct argument text.

    Raises :class:`CorpusError` for a point whose counter has the point's own text (it could not be retrieved)."""
    paired = corpus.paired(split, max_debates)
    texts = pd.unique(corpus.arguments["text"])
    row = pd.Series(np.arange(len(texts)), index=texts)
    point_texts = paired.table["text"].to_numpy()
    query = row[point_texts[paired.query]].to_numpy()
    counter = row[point_texts[paired.counter]].to_numpy()
    ids = paired.table["pair_id"].to_numpy()[paired.query]
    same = np.flatnonzero(query == counter)
    if len(same):
        raise CorpusError(f"{len(same)} point(s) of {split} have their counter's text, e.g. {ids[same[0]]}")
    return CorpusQueries(paired.name, pd.DataFrame({"text": texts}), query, counter, tuple(ids))


def protocol_ranks(
    queries: CorpusQueries,
    score: str,
    model: BiModel | None = None,
    emb: Embeddings | None = None,
    rerank: Rerank = SCHEMA_RERANK,
) -> Ranks:
    """[Q] the rank from 1 of each query's relevant document among all its candidates (:class:`CorpusQueries`) under
    ``score`` (:func:`~.official_tasks.evaluate_tasks`' scores), ties counted against it.

    ``emb``: the :class:`Embeddings` of every candidate row (not needed for ``tfidf``, whose vectoriser is fit on the
    candidates' texts). ``rerank``: as in :func:`~.official_tasks.evaluate_tasks`."""

    def pools(pairs: np.ndarray) -> dict[str, np.ndarray]:
        return {POOL: queries.false_candidates(pairs)}

    if score == "rerank":
        ranks = pool_ranks(model, emb, queries, pools, rerank)[POOL]
    else:
        score_of = scorer_of(queries, score, model, emb, rerank.device, rerank.batch_size)
        ranks = block_ranks(queries, score_of, pools, cells=rerank.cells)[POOL]
    return Ranks(ranks)


def protocol_metrics(ranks: Ranks) -> dict[str, float | int | None]:
    """The numbers of the protocol from the relevant documents' ranks: ``ndcg_at_10`` (the headline), ``mrr_at_10``,
    ``recall_at_100`` (MTEB's names), ``accuracy_at_1`` and ``mrr`` (the whole ranking), and ``queries``."""
    return {
        "ndcg_at_10": ndcg_at(ranks, 10),
        "mrr_at_10": mrr_at(ranks, 10),
        "recall_at_100": recall_at(ranks, 100),
        "accuracy_at_1": top1(ranks),
        "mrr": mrr(ranks),
        "queries": len(ranks),
    }


def per_query(ranks: Ranks, metric: str) -> np.ndarray:
    """[Q] float: ``metric`` (a key of :func:`protocol_metrics` but ``queries``) of each query alone, from the same
    definitions, so that their mean is the metric and a bootstrap over queries resamples them."""
    return np.array(
        [protocol_metrics(ranks.of(np.arange(len(ranks)) == i))[metric] for i in range(len(ranks))], dtype=float
    )
