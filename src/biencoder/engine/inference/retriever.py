"""Counters for new arguments from a trained run: :class:`Retriever` (``python -m biencoder.retrieve`` is its command).

The candidates are any collection of texts (:class:`Candidates`). Each query gets the run's own retrieve-then-rerank:
the nearest ``max(k, the run's eval.k)`` candidates in the space it was selected with (its sim head, or the encoder's
cosine with ``eval.retrieve=encoder``), reordered by the pair classifier's logit margin; the top k are returned with
both scores (:class:`Hit`). A candidate whose text equals the query is never returned for it.

Candidate embeddings are computed once per collection and kept in the embedding cache
(:attr:`EncodingSettings.cache_dir`, default ``trainer.cache_dir``'s ``~/.cache/biencoder``), keyed on the encoder's
weights, tokenizer, pooling and length: the second search against the same collection reads them back::

    from biencoder.engine.inference.retriever import Candidates, Retriever
    retriever = Retriever("logs/runs/<run>", Candidates(["text", ...], ids=["a", ...]))
    for hit in retriever.search(["my argument"], k=5)[0]:
        print(hit.rank, hit.id, hit.rerank_score, hit.text)
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ...errors import BiencoderError
from ..config.schema import TrainerSchema, default_cache_dir
from ..modeling.encoding import Encoding, TextEncoder, embed_pooled, pooled_vectors
from ..modeling.model import Embeddings
from ..retrieval.order import NONE, first_kept
from ..retrieval.rerank import shortlist_margins
from ..retrieval.search import NeighbourIndex
from ..runs.checkpoint import load_checkpoint

#: the embedding cache a retriever uses unless told otherwise, read once when this module is imported (the one
#: definition is :func:`~biencoder.engine.config.schema.default_cache_dir`, ``trainer.cache_dir``'s default too)
DEFAULT_CACHE = default_cache_dir()


class InputError(BiencoderError, ValueError):
    """A query or candidate input that cannot be used; the message names it and the fix."""


@dataclass
class Hit:
    rank: int
    id: str
    text: str
    retrieval_distance: float  # in the retrieve space (smaller = nearer)
    rerank_score: float  # classifier logit margin l1 - l0 (higher = more likely the counter)


@dataclass(frozen=True)
class Candidates:
    """The collection a :class:`Retriever` searches: ``texts``, and ``ids`` naming them in the results (None: "0",
    "1", ... by position)."""

    texts: list[str]
    ids: list[str] | None = None

    def names(self) -> list[str]:
        """The id of every text, as a string."""
        return [str(i) for i in (self.ids if self.ids is not None else range(len(self.texts)))]


@dataclass(frozen=True)
class EncodingSettings:
    """How a :class:`Retriever` embeds texts: on ``device`` (``cpu`` or ``cuda``), ``batch_size`` texts per encoder
    call (None, ``trainer.eval_batch_size``'s default: the device's, 64 on a CPU and 512 on a GPU:
    :func:`~biencoder.engine.machine.runtime.eval_batch_size`), through the embedding cache ``cache_dir`` (None: no
    cache), with progress bars when ``progress``."""

    device: str = "cpu"
    cache_dir: str | Path | None = DEFAULT_CACHE
    batch_size: int | None = TrainerSchema.eval_batch_size
    progress: bool = False


class Retriever:
    """A trained run, loaded once, over a fixed candidate collection whose embeddings are computed once.

    Args:
        run: a run folder of ``biencoder.train`` or its ``best.pt``.
        candidates: the collection (:class:`Candidates`; a list of texts is ``Candidates(texts)``).
        encoding: how texts are embedded (:class:`EncodingSettings`; default: on the CPU through the cache).
    Raises :class:`InputError` for an empty collection.
    """

    def __init__(self, run: str | Path, candidates: Candidates | list[str], encoding: EncodingSettings | None = None):
        candidates = candidates if isinstance(candidates, Candidates) else Candidates(list(candidates))
        if not candidates.texts:
            raise InputError("no candidate texts: pass a non-empty collection")
        self.encoding = encoding = encoding or EncodingSettings()
        self.model, self.tokenizer, self.model_cfg, self.settings = load_checkpoint(run, encoding.progress, what="run")
        self.device = torch.device(encoding.device)
        self.model.to(self.device)
        self.texts = list(candidates.texts)
        self.copies = Counter(self.texts)  # text -> how many candidates have it (0 for any other text)
        self.ids = candidates.names()
        self.space = self.settings["retrieve"]
        self.batch_size = encoding.batch_size
        start = time.time()
        pooled = self._pool(self.texts, encoding.cache_dir, encoding.progress, "encode candidates")
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
        if not queries:
            return []
        k = min(k, len(self.texts))
        shortlist = max(k, int(self.settings["k"]))
        q = embed_pooled(self.model, self._pool(queries), device=self.device)
        # as many neighbours more than the shortlist as the collection holds copies of a query's text: those are
        # never returned for it, so at most that many are dropped and the shortlist stays full whenever it can be
        copies = max((self.copies[query] for query in queries), default=0)
        dist, rows = self.index.query(q.retrieval(self.space).numpy().astype(np.float64), shortlist + copies)
        keep = np.array([[self.texts[r] != query for r in row] for row, query in zip(rows, queries, strict=True)])
        rows, dist = first_kept(rows, dist, keep, shortlist)
        # the queries are rows 0..n-1 of the pairs' embeddings, the candidates follow them
        both = Embeddings(torch.cat([q.sim, self.candidates.sim]), torch.cat([q.pooled, self.candidates.pooled]))
        n = len(queries)
        [margins] = shortlist_margins(
            self.model, both, np.arange(n), [np.where(rows == NONE, NONE, n + rows)], device=self.device
        )
        return [self._hits(rows[i], dist[i], margins[i], k) for i in range(n)]

    def _hits(self, rows: np.ndarray, dist: np.ndarray, margins: np.ndarray, k: int) -> list[Hit]:
        """One query's top ``k`` of its shortlist ``rows`` (candidate indices, :data:`NONE` for none), by margin, then
        by distance."""
        listed = np.flatnonzero(rows != NONE)
        order = sorted(listed, key=lambda j: (-margins[j], dist[j]))[:k]
        return [
            Hit(rank + 1, self.ids[rows[j]], self.texts[rows[j]], float(dist[j]), float(margins[j]))
            for rank, j in enumerate(order)
        ]
