"""What ``negatives.log=true`` records of each epoch's mined negatives (:func:`negatives_record`, written by
:mod:`biencoder.engine.runs.negative_log`) and one epoch's summary of such a record (:func:`summarise_record`,
``biencoder-corpus negatives``)."""

from __future__ import annotations

import numpy as np

from ..data.paired import PairedSplit
from .negatives import MinedNegatives, allowed_texts, forbidden_texts, row_block, squared_distances

#: the arrays of one epoch's record (``negatives/epoch_<NNN>.npz``), one value per training pair, in pair order
RECORD_FIELDS = ("row", "is_random", "rank", "distance", "positive_distance", "positive_of_other")


def negatives_record(sim: np.ndarray, split: PairedSplit, mined: MinedNegatives, block: int | None = None) -> dict:
    """What ``negatives.log=true`` writes for one epoch: per pair (:data:`RECORD_FIELDS`) the negative's ``row`` in
    the split's table, ``is_random``, its ``rank`` (1 + the eligible arguments strictly nearer the point: 1 is the
    hardest eligible one; float64 squared distances, so equal distances share a rank), its ``distance`` to the point
    and the counter's (``positive_distance``), and ``positive_of_other``: its text is the counter (known positive) of
    another pair. Plus ``rate``, the epoch's share of random negatives."""
    sim = np.asarray(sim, dtype=np.float64)
    queries, counters, text_id = split.query, split.counter, split.text_id
    banned = forbidden_texts(split)
    squares = (sim * sim).sum(axis=1)
    rank = np.zeros(len(queries), dtype=np.int64)
    block = block or row_block(len(sim))
    for start in range(0, len(queries), block):
        part = slice(start, start + block)
        d2 = squared_distances(sim[queries[part]], sim, squares)  # [B, 2Q]
        own = d2[np.arange(len(d2)), mined.row[part]]
        eligible = allowed_texts(text_id, banned[part])
        rank[part] = 1 + ((d2 < own[:, None]) & eligible).sum(axis=1)
    return {
        "row": mined.row.astype(np.int64),
        "is_random": mined.is_random.astype(bool),
        "rank": rank,
        "distance": np.asarray(mined.distance, dtype=np.float64),
        "positive_distance": np.linalg.norm(sim[queries] - sim[counters], axis=1),
        "positive_of_other": np.isin(text_id[mined.row], text_id[counters]),
        "rate": np.float64(mined.rate),
    }


def summarise_record(record, previous=None) -> dict[str, float]:
    """One epoch's summary of a :func:`negatives_record` (``biencoder-corpus negatives``): the share of hard
    negatives; the share of negatives (all, and hard ones) whose text is another pair's counter; the hard negatives'
    median rank, median distance, median positive distance and median gap (negative's distance minus the positive's:
    below 0, the negative is nearer the point than its counter); the share of pairs whose negative is the one of the
    ``previous`` epoch's record."""
    hard = ~np.asarray(record["is_random"], dtype=bool)
    other = np.asarray(record["positive_of_other"], dtype=bool)
    gap = np.asarray(record["distance"]) - np.asarray(record["positive_distance"])

    def median(values) -> float:
        return float(np.median(values)) if len(values) else float("nan")

    return {
        "pairs": int(len(hard)),
        "rate": float(record["rate"]),
        "share_hard": float(hard.mean()),
        "share_positive_of_other": float(other.mean()),
        "share_positive_of_other_hard": float(other[hard].mean()) if hard.any() else float("nan"),
        "median_rank_hard": median(np.asarray(record["rank"])[hard]),
        "median_distance_hard": median(np.asarray(record["distance"])[hard]),
        "median_positive_distance": median(np.asarray(record["positive_distance"])),
        "median_gap_hard": median(gap[hard]),
        "share_negative_below_positive_hard": float((gap[hard] < 0).mean()) if hard.any() else float("nan"),
        "share_same_as_previous": float((np.asarray(record["row"]) == np.asarray(previous["row"])).mean())
        if previous is not None
        else float("nan"),
    }
