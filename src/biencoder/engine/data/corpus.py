"""The ArguAna counterargs corpus as tables (Wachsmuth, Syed & Stein, ACL 2018): :func:`read_corpus` (the folders are
read by :mod:`.layout`), its pairs, the cross-split overlap and deduplication, and the paired splits
(:class:`~.paired.PairedSplit`) a run uses; :func:`run_splits`, the one entry that reads a run's data, whichever
reader ``data.layout`` names (this one, or :mod:`.pairs` for pair files).

A *pair* is a point and the counter with the same split, theme, debate, stance and number.

Command line::

    python -m biencoder.corpus stats <root> [--json]
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from ..config.packaged import demo_root
from ..config.schema import DataSchema
from .arguana import SPLITS, CorpusError, read_split, resolve_root
from .beir import read_beir
from .pair_files import PairFiles, read_pairs
from .paired import SPLIT_NAMES, PairedSplit, dedup_keep, seen_queries, split_name

__all__ = [
    "ARGUMENT_COLUMNS",
    "PAIR_COLUMNS",
    "SPLIT_NAMES",
    "Corpus",
    "CorpusError",
    "PairedSplit",
    "read_corpus",
    "run_splits",
    "seen_queries",
    "split_name",
]  # the paired splits' names stay importable from here

ARGUMENT_COLUMNS = ["split", "theme", "debate", "stance", "number", "kind", "conclusion", "premise", "text", "path"]
PAIR_COLUMNS = ["split", "theme", "debate", "stance", "pair_id", "point_text", "counter_text"]


@dataclass(frozen=True)
class Corpus:
    """Everything read from one corpus root (``counts`` is keyed by the printed split names: train, val, test).

    ``arguments``: one row per argument file (columns :data:`ARGUMENT_COLUMNS`).
    ``pairs``: one row per point that has a counter (columns :data:`PAIR_COLUMNS`, plus ``point_row`` and
    ``counter_row``, the row labels of both in ``arguments``).
    ``debates``: one row per debate folder (split, theme, debate, url from metadata.txt).
    ``dropped``: pairs removed per split by :meth:`deduplicated` (empty for the official splits).
    ``unpaired``: the arguments left out for want of their other half, as ``<split>/<theme>/<debate>/<side><NN>:
    point without a counter`` (or ``counter without a point``), in file order.
    """

    root: Path
    arguments: pd.DataFrame
    pairs: pd.DataFrame
    counts: dict[str, dict[str, int]]
    debates: pd.DataFrame = None
    dropped: dict[str, int] = None
    unpaired: tuple[str, ...] = ()

    def split_pairs(self, split: str) -> pd.DataFrame:
        """The pairs of ``split`` (either spelling)."""
        return self.pairs[self.pairs["split"] == SPLIT_NAMES[split_name(split)]]

    def _text_pairs(self, split: str) -> list[tuple[str, str]]:
        """(point text, counter text) of each pair of ``split``, in order."""
        pairs = self.split_pairs(split)
        return list(zip(pairs["point_text"], pairs["counter_text"], strict=True))

    def texts(self, split: str) -> set[str]:
        """Every argument text of ``split`` (points without a counter too)."""
        return set(self.arguments.loc[self.arguments["split"] == SPLIT_NAMES[split_name(split)], "text"])

    def deduplicated(self) -> Corpus:
        """The splits without their text-level overlap (protocol.md), in the order test → val → train:

        test is untouched (its pools stay the official ones); val drops every pair whose point or counter text
        occurs in test; train drops every pair whose point or counter text occurs in val or test. ``dropped``
        says how many pairs each split lost; ``counts`` still describes the corpus on disk.
        """
        kept_by = dedup_keep(self.split_pairs, self.texts, ("point_text", "counter_text"))
        keep_val, keep_train = kept_by["val"], kept_by["train"]
        kept = pd.concat(
            [self.split_pairs("train")[keep_train], self.split_pairs("val")[keep_val], self.split_pairs("test")]
        )
        dropped = {"train": int((~keep_train).sum()), "val": int((~keep_val).sum()), "test": 0}
        return replace(
            self, pairs=kept.sort_values(["split", "pair_id"], kind="stable").reset_index(drop=True), dropped=dropped
        )

    def overlap(self) -> dict[str, dict[str, int]]:
        """Cross-split overlap, per ordered pair of splits ``a->b`` (and ``test->train+val``): the pairs of a whose
        point and counter texts occur together as a pair of b, the distinct texts of a found in b, and the
        debates of a whose URL (metadata.txt) is also a debate of b."""
        pair_list = {s: self._text_pairs(s) for s in SPLIT_NAMES}
        pair_set = {s: set(pairs) for s, pairs in pair_list.items()}
        urls = {s: set(self.debates.loc[self.debates["split"] == SPLIT_NAMES[s], "url"].dropna()) for s in SPLIT_NAMES}
        out = {}
        targets = [(a, (b,)) for a in SPLIT_NAMES for b in SPLIT_NAMES if a != b] + [("test", ("train", "val"))]
        for a, bs in targets:
            pairs_b = set().union(*(pair_set[b] for b in bs))
            texts_b = set().union(*(self.texts(b) for b in bs))
            urls_b = set().union(*(urls[b] for b in bs))
            out[f"{a}->{'+'.join(bs)}"] = {
                "pairs": sum(pair in pairs_b for pair in pair_list[a]),
                "of_pairs": len(pair_list[a]),
                "texts": len(self.texts(a) & texts_b),
                "of_texts": len(self.texts(a)),
                "debates": int(self.debates.loc[self.debates["split"] == SPLIT_NAMES[a], "url"].isin(urls_b).sum()),
                "of_debates": int((self.debates["split"] == SPLIT_NAMES[a]).sum()),
            }
        return out

    def used(self, dedup: bool) -> Corpus:
        """The corpus a run uses: :meth:`deduplicated` when ``dedup`` (``data.dedup``), else the official splits."""
        return self.deduplicated() if dedup else self

    def paired(
        self, split: str, max_debates: int | None = DataSchema.max_debates, pool: str = DataSchema.pool
    ) -> PairedSplit:
        """The :class:`PairedSplit` of ``split`` (``train``/``val``/``test`` or the folder name).

        ``max_debates`` keeps only the pairs of the first N debates (by theme/debate name): a quick slice whose
        pools are still whole debates. ``pool``: ``data.pool`` (:class:`PairedSplit`).
        """
        split = split_name(split)
        pairs = self.pairs[self.pairs["split"] == SPLIT_NAMES[split]]
        if max_debates is not None:
            debate = pairs["theme"] + "/" + pairs["debate"]
            pairs = pairs[debate.isin(sorted(debate.unique())[:max_debates])]
        points = self.arguments.loc[pairs["point_row"]]
        counters = self.arguments.loc[pairs["counter_row"]]
        table = pd.concat([points, counters], ignore_index=True)[["theme", "debate", "stance", "kind", "text"]]
        table["pair_id"] = np.tile(pairs["pair_id"].to_numpy(), 2)
        table["text_id"] = pd.factorize(table["text"])[0]
        return PairedSplit(name=split, table=table, pool=pool)


def run_splits(data) -> tuple[Corpus | PairFiles, dict[str, PairedSplit]]:
    """The corpus a run uses and its paired splits ``{"train", "val", "test"}``, from the ``data`` config group (a
    DictConfig or a dict): the one definition of which pairs, and so which texts, a run reads and encodes (the
    runner, the baselines of ``biencoder-plot``, ``scripts/bench.py``'s embedding-cache check).

    ``data.layout=arguana`` reads the folders under ``root`` (``max_debates`` slices them); ``pairs`` reads pair files
    (:func:`.pairs.read_pairs`); ``beir`` a BEIR folder under ``root`` (:func:`.beir.read_beir`: its splits are
    :class:`~.judged.JudgedSplit`, the corpus the candidates of each). Either way ``dedup`` removes the cross-split
    overlap by text and ``pool`` is the candidate pool of the per-epoch top-1. Keys a run saved before they existed
    take their schema defaults."""
    pool = data.get("pool", "all")
    if data.get("layout", "arguana") == "beir":
        beir = read_beir(data["root"]).used(data["dedup"])
        return beir, {name: beir.paired(name, pool) for name in SPLIT_NAMES}
    if data.get("layout", "arguana") == "pairs":
        pairs = read_pairs(data).used(data["dedup"])
        return pairs, {name: pairs.paired(name, pool) for name in SPLIT_NAMES}
    corpus = read_corpus(data["root"]).used(data["dedup"])
    return corpus, {name: corpus.paired(name, data["max_debates"], pool) for name in SPLIT_NAMES}


def read_corpus(root: str | Path) -> Corpus:
    """Read all three splits under ``root`` (see :func:`resolve_root`; ``"demo"`` is the bundled corpus) into
    pandas tables.

    Raises :class:`CorpusError` on a missing root or split folders, a split without pairs, a file that is not
    UTF-8 or an empty argument file. Stray files are ignored with a :class:`CorpusWarning` (dot-files silently).
    """
    folder = resolve_root(demo_root() if str(root) == "demo" else root)
    rows: list[dict] = []
    debates: list[dict] = []
    shape: dict[str, tuple[int, int]] = {}
    for split in SPLITS:
        split_rows, n_themes, split_debates = read_split(folder / split, split)
        rows.extend(split_rows)
        debates.extend(split_debates)
        shape[split] = (n_themes, len(split_debates))
    arguments = pd.DataFrame(rows, columns=ARGUMENT_COLUMNS)

    pairs, merged = _pairs(arguments)
    counts = {split_name(split): _counts(arguments, merged, split, shape[split], folder) for split in SPLITS}
    return Corpus(
        root=folder,
        arguments=arguments,
        pairs=pairs,
        counts=counts,
        debates=pd.DataFrame(debates, columns=["split", "theme", "debate", "url"]),
        dropped={},
        unpaired=_unpaired(merged),
    )


def _unpaired(merged: pd.DataFrame) -> tuple[str, ...]:
    """The points without a counter and the counters without a point of :func:`_pairs`' outer merge, named."""
    alone = merged[merged["point_row"].isna() | merged["counter_row"].isna()].sort_values(
        ["split", "theme", "debate", "stance", "number"], kind="stable"
    )
    return tuple(
        f"{row.split}/{row.theme}/{row.debate}/{row.stance}{row.number:02d}: "
        + ("counter without a point" if pd.isna(row.point_row) else "point without a counter")
        for row in alone.itertuples()
    )


def _pairs(arguments: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(pairs, merged): the points and counters with the same split, theme, debate, stance and number, as one table
    (:data:`PAIR_COLUMNS` + their rows in ``arguments``, by split and pair id), and the outer merge they come from
    (for the counts of points without a counter and counters without a point)."""
    key = ["split", "theme", "debate", "stance", "number"]
    points = arguments[arguments["kind"] == "point"]
    counters = arguments[arguments["kind"] == "counter"]
    merged = points.reset_index(names="point_row").merge(
        counters.reset_index(names="counter_row"), on=key, suffixes=("_point", "_counter"), how="outer"
    )
    pairs = merged[merged["point_row"].notna() & merged["counter_row"].notna()].copy()
    pairs["pair_id"] = (
        pairs["theme"] + "/" + pairs["debate"] + "/" + pairs["stance"] + pairs["number"].map("{:02d}".format)
    )
    pairs = pairs.rename(columns={"text_point": "point_text", "text_counter": "counter_text"})
    pairs[["point_row", "counter_row"]] = pairs[["point_row", "counter_row"]].astype(int)
    pairs = pairs[PAIR_COLUMNS + ["point_row", "counter_row"]].sort_values(["split", "pair_id"], kind="stable")
    return pairs.reset_index(drop=True), merged


def _counts(
    arguments: pd.DataFrame, merged: pd.DataFrame, split: str, shape: tuple[int, int], folder: Path
) -> dict[str, int]:
    """The counts of one split (``corpus stats``); raises :class:`CorpusError` when it has no pair."""
    in_split = merged["split"] == split
    has_both = merged["point_row"].notna() & merged["counter_row"].notna()
    n_pairs = int((has_both & in_split).sum())
    if n_pairs == 0:
        raise CorpusError(
            f"split '{split}' under '{folder}' has no pairs (point + counter with the same side and number): "
            "check that it holds <theme>/<debate>/pro|con/proNNa-point.txt and proNNb-counter.txt files"
        )
    texts = arguments.loc[arguments["split"] == split, "text"]
    kinds = arguments.loc[arguments["split"] == split, "kind"]
    return {
        "themes": shape[0],
        "debates": shape[1],
        "points": int((kinds == "point").sum()),
        "counters": int((kinds == "counter").sum()),
        "pairs": n_pairs,
        "points_without_counter": int((in_split & merged["counter_row"].isna()).sum()),
        "counters_without_point": int((in_split & merged["point_row"].isna()).sum()),
        "duplicated_texts": int((texts.value_counts() > 1).sum()),
    }
