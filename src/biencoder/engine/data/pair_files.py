"""Pair files: the same ablation on any query → positive data (``data=pairs``; docs/own-data.md).

One file per split (``data.train``, ``data.val``, ``data.test``) or one file with a split column (``data.file``), as
JSON Lines, CSV, TSV or Parquet (the format from the suffix, or ``data.format``). Columns as sentence-transformers
names them: ``anchor`` and ``positive`` (required), ``negative`` (optional: a given negative of the pair, trained on
besides the mined ones) and ``group`` (optional: the within-group top-1's pool); ``data.columns.<role>=<name>`` maps
other names, and other columns are ignored. Texts lose the whitespace at their ends, as ArguAna's files do.

:func:`read_pairs` gives a :class:`PairFiles`, which has the ArguAna :class:`~.corpus.Corpus`'s interface
(``used(dedup)``, ``deduplicated()``, ``overlap()``, ``paired(split, pool)``, ``counts``, ``dropped``), so the runner
and everything after it read both alike. Every row is one pair, duplicates included (counted in ``counts``), as
ArguAna's twin debates are. The files are read and checked row by row by :mod:`.pair_records` (whatever cannot be
used is a :class:`~.pair_records.PairsError`: one line naming the file, the line or row, and the fix; its
:func:`~.pair_records.data_files` is the provenance, path, size and sha256 of each file, a run folder records).
:func:`export_pairs` writes an ArguAna corpus as pair files.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from ..config.schema import DataSchema
from ..files import strict_json
from .pair_records import PairsError, data_paths, pair_table, read_records, resolve_columns
from .paired import SPLIT_NAMES, PairedSplit, dedup_keep, split_name

#: fewer pairs than this and no query has a wrong candidate to beat
MIN_PAIRS = 2
#: the file names export_pairs writes (and a folder of pair files holds)
EXPORTED = {name: f"{name}.jsonl" for name in SPLIT_NAMES}


def read_pairs(data, option: str = "data.columns.") -> PairFiles:
    """Read the pair files a ``data`` config names (``train``/``val``/``test`` or ``file``, ``format``, ``columns``;
    a DictConfig or a dict) into a :class:`PairFiles` with the official splits (``data.dedup`` is
    :meth:`PairFiles.used`'s). Raises :class:`PairsError` on anything listed in the module docstring, naming a column
    override as the caller spells it (``option``: :func:`resolve_columns`)."""
    paths = data_paths(data)
    mapping = dict(data.get("columns") or {})
    if not paths or ("file" not in paths and set(paths) != set(SPLIT_NAMES)):
        raise PairsError(
            "data=pairs needs data.train, data.val and data.test (one file each), or data.file (one file "
            "with a split column): e.g. data.train=train.jsonl data.val=val.jsonl data.test=test.jsonl"
        )
    tables, files, grouped = [], {}, {}
    for role, path in paths.items():
        records, files[role] = read_records(Path(path), role, data.get("format"))
        used = resolve_columns(records, mapping, ("split",) if role == "file" else (), option)
        tables.append(pair_table(records, used, None if role == "file" else role))
        grouped[records.label] = used["group"] is not None
    if len(set(grouped.values())) > 1:
        with_group = [label for label, has in grouped.items() if has]
        without = [label for label, has in grouped.items() if not has]
        raise PairsError(
            f"{with_group[0]} has a group column and {without[0]} has none: give every file one, or "
            f"read none with {option}group=null"
        )
    pairs = pd.concat(tables, ignore_index=True)
    pairs = pairs.astype(object).where(pairs.notna(), None)  # one missing value, None, whatever the files held
    found = PairFiles(pairs=pairs, files=files, has_group=any(grouped.values()), dropped={})
    found.check()
    return found


# -- the pair files as a corpus ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PairFiles:
    """Pair files read by :func:`read_pairs`. ``pairs``: one row per pair (split ``train``/``val``/``test``, anchor,
    positive, negative, group, source, where), each split in file order; ``files``: :func:`data_files`'s record;
    ``has_group``: the files have a group column; ``dropped``: pairs removed per split by :meth:`deduplicated`."""

    pairs: pd.DataFrame
    files: dict[str, dict]
    has_group: bool = False
    dropped: dict[str, int] = field(default_factory=dict)

    def split_pairs(self, split: str) -> pd.DataFrame:
        return self.pairs[self.pairs["split"] == split_name(split)]

    def _text_pairs(self, split: str) -> list[tuple[str, str]]:
        """(anchor, positive) of each pair of ``split``, in order."""
        pairs = self.split_pairs(split)
        return list(zip(pairs["anchor"], pairs["positive"], strict=True))

    def texts(self, split: str) -> set[str]:
        """Every anchor and positive text of ``split``."""
        pairs = self.split_pairs(split)
        return set(pairs["anchor"]) | set(pairs["positive"])

    def check(self, after: str = "") -> None:
        """Every split holds at least :data:`MIN_PAIRS` pairs and three distinct texts (a mined negative is a text
        other than its pair's two); else :class:`PairsError`."""
        for name in SPLIT_NAMES:
            pairs = self.split_pairs(name)
            where = f"'{(self.files.get(name) or self.files['file'])['path']}'"
            if len(pairs) < MIN_PAIRS:
                raise PairsError(
                    f"{where}: split '{name}' has {len(pairs)} pair{'s' * (len(pairs) != 1)}{after}: a "
                    f"split needs at least {MIN_PAIRS} (a query needs a wrong candidate to beat)"
                )
            if len(self.texts(name)) < 3:
                raise PairsError(
                    f"{where}: split '{name}' has only {len(self.texts(name))} distinct texts{after}: "
                    "add pairs with other texts (a negative must be a third text)"
                )

    @property
    def counts(self) -> dict[str, dict[str, int]]:
        """Per split: pairs, duplicated_pairs (rows that repeat an earlier anchor and positive), distinct texts,
        anchors and positives, rows with a given negative, groups."""
        out = {}
        for name in SPLIT_NAMES:
            p = self.split_pairs(name)
            out[name] = {
                "pairs": len(p),
                "duplicated_pairs": int(p.duplicated(["anchor", "positive"]).sum()),
                "distinct_texts": len(self.texts(name)),
                "anchors": int(p["anchor"].nunique()),
                "positives": int(p["positive"].nunique()),
                "with_negative": int(p["negative"].notna().sum()),
                "groups": int(p["group"].nunique()),
            }
        return out

    def deduplicated(self, check: bool = True) -> PairFiles:
        """The splits without their text-level overlap, in the order test → val → train, as for ArguAna
        (:meth:`.corpus.Corpus.deduplicated`): val drops every pair whose anchor or positive text occurs in test;
        train drops every pair whose anchor or positive text occurs in val or test. With ``check``, raises
        :class:`PairsError` when a split is left too small (a run could not use it)."""
        kept_by = dedup_keep(self.split_pairs, self.texts, ("anchor", "positive"))
        keep_val, keep_train = kept_by["val"], kept_by["train"]
        kept = pd.concat(
            [self.split_pairs("train")[keep_train], self.split_pairs("val")[keep_val], self.split_pairs("test")],
            ignore_index=True,
        )
        out = replace(
            self, pairs=kept, dropped={"train": int((~keep_train).sum()), "val": int((~keep_val).sum()), "test": 0}
        )
        if check:
            out.check(
                " once data.dedup dropped the pairs that share a text with a later split (data.dedup=false keeps them)"
            )
        return out

    def used(self, dedup: bool) -> PairFiles:
        """The pairs a run uses: :meth:`deduplicated` when ``dedup`` (``data.dedup``), else the files' splits."""
        return self.deduplicated() if dedup else self

    def overlap(self) -> dict[str, dict[str, int]]:
        """Cross-split overlap per ordered pair of splits ``a->b`` (and ``test->train+val``): the pairs of a whose
        anchor and positive occur together as a pair of b, and the distinct texts of a found in b."""
        pair_list = {s: self._text_pairs(s) for s in SPLIT_NAMES}
        pair_set = {s: set(pairs) for s, pairs in pair_list.items()}
        targets = [(a, (b,)) for a in SPLIT_NAMES for b in SPLIT_NAMES if a != b] + [("test", ("train", "val"))]
        out = {}
        for a, bs in targets:
            pairs_b = set().union(*(pair_set[b] for b in bs))
            texts_b = set().union(*(self.texts(b) for b in bs))
            out[f"{a}->{'+'.join(bs)}"] = {
                "pairs": sum(pair in pairs_b for pair in pair_list[a]),
                "of_pairs": len(pair_list[a]),
                "texts": len(self.texts(a) & texts_b),
                "of_texts": len(self.texts(a)),
            }
        return out

    def paired(self, split: str, pool: str = DataSchema.pool) -> PairedSplit:
        """The :class:`PairedSplit` of ``split``: anchors (rows 0..Q-1) then positives, in file order; ``group`` when
        the files have one; the given negatives with the index of their pair."""
        name = split_name(split)
        pairs = self.split_pairs(name).reset_index(drop=True)
        pair_id = (pairs["source"].str.strip("'") + ":" + pairs["where"]).tolist()
        table = pd.DataFrame(
            {
                "kind": ["anchor"] * len(pairs) + ["positive"] * len(pairs),
                "text": pd.concat([pairs["anchor"], pairs["positive"]], ignore_index=True),
                "pair_id": pair_id * 2,
            }
        )
        if self.has_group:
            table["group"] = pd.concat([pairs["group"], pairs["group"]], ignore_index=True)
        table["text_id"] = pd.factorize(table["text"])[0]
        given = pairs["negative"].notna().to_numpy()
        negatives = pd.DataFrame({"pair": given.nonzero()[0], "text": pairs.loc[given, "negative"].to_numpy()})
        return PairedSplit(name=name, table=table, pool=pool, negatives=negatives)


# -- export: an ArguAna corpus as pair files --------------------------------------------------------------------------
def export_pairs(corpus, folder: str | Path) -> dict[str, Path]:
    """Write the official splits of ``corpus`` (an ArguAna :class:`~.corpus.Corpus`) into ``folder`` as
    ``train.jsonl``, ``val.jsonl`` and ``test.jsonl``: one ``{"anchor": point, "positive": counter, "group":
    "<theme>/<debate>"}`` per pair, in the corpus's pair order, so that reading them back gives the same paired splits.
    Each file is written atomically; an existing one is never overwritten (:class:`PairsError`)."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise PairsError(f"'{folder}' is a file: export into a folder")
    taken = [folder / name for name in EXPORTED.values() if (folder / name).exists()]
    if taken:
        raise PairsError(f"'{taken[0]}' exists: export into a new or empty folder (nothing was written)")
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for split, name in EXPORTED.items():
        pairs = corpus.split_pairs(split)
        lines = [
            strict_json({"anchor": a, "positive": p, "group": f"{t}/{d}"}, ensure_ascii=False) + "\n"
            for a, p, t, d in zip(
                pairs["point_text"], pairs["counter_text"], pairs["theme"], pairs["debate"], strict=True
            )
        ]
        out[split] = _write_atomic(folder / name, "".join(lines))
    return out


def _write_atomic(path: Path, text: str) -> Path:
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    umask = os.umask(0)
    os.umask(umask)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o666 & ~umask)  # as open() would make it, not mkstemp's owner-only mode
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path
