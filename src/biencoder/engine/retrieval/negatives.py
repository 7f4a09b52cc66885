"""Hard-negative mining over sim embeddings by exact search (or scikit-learn's BallTree), mixed with random negatives.

For every pair's point: the nearest argument of the split, point or counter (by Euclidean distance of the sim
embeddings, one search over all of them: ``negatives.index``), skipping the point itself, its own counter and every
argument whose text equals the point's or the counter's text, is the hard negative. (This is the closer of the
nearest allowed point and the nearest allowed counter; at equal distance the lower row, a point, wins.)
With probability ``random_rate`` a uniformly random eligible argument is taken instead; only the points of the pairs
without a random negative are searched for.

A BEIR split (:class:`~biencoder.engine.data.judged.JudgedSplit`) draws from its documents only
(:attr:`~biencoder.engine.data.paired.PairedSplit.negative_rows`), and a query's negative never has the text of the
query, of its own document or of any document relevant to it (:meth:`~biencoder.engine.data.paired.PairedSplit.
banned_texts`): one negative per query, shared by the triplets of its relevant documents.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..config.schema import NegativesSchema, RandomRateSchema
from ..data.corpus import PairedSplit
from ..machine.runtime import Runtime
from .search import SEARCH_BLOCK, NeighbourIndex


def random_rate(epoch: int, start: float = RandomRateSchema.start, decay: float = RandomRateSchema.decay) -> float:
    """Share of random negatives in ``epoch``: ``max(0, start − decay·epoch)``."""
    return max(0.0, start - decay * epoch)


@dataclass(frozen=True)
class Mining:
    """How hard negatives are searched for: ``n_neighbors`` neighbours fetched at first (more for the rare rows that
    need them), by the ``index`` ``exact`` or ``balltree`` (:mod:`biencoder.engine.retrieval.search`; ``device`` is
    where ``exact`` runs). The defaults are the schema's (``negatives.n_neighbors``, ``negatives.index``)."""

    n_neighbors: int = NegativesSchema.n_neighbors
    index: str = NegativesSchema.index
    device: str | torch.device = "cpu"

    @classmethod
    def of_run(cls, negatives: NegativesSchema, runtime: Runtime) -> Mining:
        """A run's: ``negatives.n_neighbors`` and ``negatives.index``, on the runtime's device."""
        return cls(negatives.n_neighbors, negatives.index, runtime.device)


@dataclass
class MinedNegatives:
    """One negative per pair: ``row`` [Q] in the split's table, ``is_random`` [Q], ``distance`` [Q] (sim space)."""

    row: np.ndarray
    is_random: np.ndarray
    distance: np.ndarray
    rate: float

    def stats(self) -> dict[str, float]:
        return {
            "random_rate": self.rate,
            "share_random": float(self.is_random.mean()),
            "share_hard": float(1.0 - self.is_random.mean()),
            "neg_distance": float(self.distance.mean()),
            "neg_distance_hard": float(self.distance[~self.is_random].mean())
            if (~self.is_random).any()
            else float("nan"),
        }


def forbidden_texts(split: PairedSplit) -> np.ndarray:
    """[Q, M] text ids a query's negative must not have (:meth:`PairedSplit.banned_texts`; -1 pads): a pair's point's
    and its counter's ([Q, 2]); a judged query's own and every relevant document's (a BEIR split)."""
    return split.banned_texts()


def has_eligible(text_id: np.ndarray, banned: np.ndarray) -> np.ndarray:
    """[Q] bool: some argument's text (``text_id``: those of the rows a negative is drawn from) is none of the query's
    ``banned`` [Q, M] text ids. Only a split of at most M distinct texts can have a query without one."""
    unique = np.unique(text_id)
    if len(unique) > banned.shape[1]:
        return np.ones(len(banned), bool)
    return (unique[None, :, None] != banned[:, None, :]).all(axis=2).any(axis=1)


def _first_allowed(
    tree: NeighbourIndex, sim: np.ndarray, queries: np.ndarray, banned: np.ndarray, text_id: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Nearest row of the split's table (indexed by ``tree``) per query whose text id is not banned; -1 / inf if none.

    A block of :data:`~biencoder.engine.retrieval.search.SEARCH_BLOCK` queries at a time: a query's neighbours are its
    own (the search is row by row) and so is how far its k doubles, so the blocks change no row, and a text shared by
    many pairs (whose queries need k ~ their count) costs [block, k], never [Q, k]."""
    best = np.full(len(queries), -1)
    dist = np.full(len(queries), np.inf)
    for start in range(0, len(queries), SEARCH_BLOCK):
        block = slice(start, start + SEARCH_BLOCK)
        best[block], dist[block] = _first_allowed_block(tree, sim, queries[block], banned[block], text_id, k)
    return best, dist


def _first_allowed_block(
    tree: NeighbourIndex, sim: np.ndarray, queries: np.ndarray, banned: np.ndarray, text_id: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_first_allowed` of one block of queries: k neighbours, then 2k for the queries that found none, ..."""
    best = np.full(len(queries), -1)
    dist = np.full(len(queries), np.inf)
    todo = np.arange(len(queries))
    while len(todo):
        k = min(k, tree.n)
        d, i = tree.query(sim[queries[todo]], k)
        cand = i  # [T, k] rows of the split table, nearest first
        ok = np.all(text_id[cand][:, :, None] != banned[todo][:, None, :], axis=2)
        found = ok.any(axis=1)
        first = ok.argmax(axis=1)
        best[todo[found]] = cand[found, first[found]]
        dist[todo[found]] = d[found, first[found]]
        if k == tree.n:
            break
        todo, k = todo[~found], 2 * k
    return best, dist


def mine_negatives(
    sim: np.ndarray, split: PairedSplit, rate: float, rng: np.random.Generator, mining: Mining = Mining()
) -> MinedNegatives:
    """One negative per pair of ``split``.

    Args:
        sim: [2Q, D] sim embeddings of the split's table rows (points then counters, see ``PairedSplit``).
        rate: probability of a random instead of a hard negative.
        rng: the only source of randomness (seeded by the caller).
        mining: how the hard ones are searched for (:class:`Mining`).
    Returns:
        :class:`MinedNegatives`; a negative never has the text of the point or of its counter.
    """
    sim = np.asarray(sim, dtype=np.float64)
    # the rows a negative is drawn from: every row of a paired split; a BEIR split's documents, never its queries
    pool = split.negative_rows
    whole = len(pool) == len(sim)
    text_id = split.text_id if whole else split.text_id[pool]
    banned = forbidden_texts(split)
    queries = split.query
    if not has_eligible(text_id, banned).all():
        raise ValueError("a pair has no eligible negative: the split needs at least one argument with another text")
    # the draw first, then the search for the hard ones only: a pair that gets a random negative needs no neighbours
    # (most of them early on: rate 0.8 at epoch 0). The search is row by row, so the hard rows are what a search of
    # every pair gives them; the RNG is drawn in the same order as ever
    is_random = rng.random(len(queries)) < rate
    row = np.full(len(queries), -1)
    hard = np.flatnonzero(~is_random)
    if len(hard):
        searched = sim if whole else sim[pool]
        tree = NeighbourIndex(searched, mining.index, mining.device)
        found, _ = _first_allowed(tree, sim, queries[hard], banned[hard], text_id, mining.n_neighbors)
        row[hard] = found if whole else np.where(found >= 0, pool[found], -1)
    todo = np.flatnonzero(is_random)
    while len(todo):  # rejection sampling: eligible arguments are the vast majority
        draw = rng.integers(0, len(text_id), size=len(todo))
        ok = np.all(text_id[draw][:, None] != banned[todo], axis=1)
        row[todo[ok]] = draw[ok] if whole else pool[draw[ok]]
        todo = todo[~ok]
    distance = np.linalg.norm(sim[queries] - sim[row], axis=1)
    return MinedNegatives(row=row, is_random=is_random, distance=distance, rate=rate)
