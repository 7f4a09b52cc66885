"""Pair files: the same ablation on any query → positive data (``data=pairs``; docs/own-data.md).

One file per split (``data.train``, ``data.val``, ``data.test``) or one file with a split column (``data.file``), as
JSON Lines, CSV, TSV or Parquet (the format from the suffix, or ``data.format``). Columns as sentence-transformers
names them: ``anchor`` and ``positive`` (required), ``negative`` (optional: a given negative of the pair, trained on
besides the mined ones) and ``group`` (optional: the within-group top-1's pool); ``data.columns.<role>=<name>`` maps
other names, and other columns are ignored. Texts lose the whitespace at their ends, as ArguAna's files do.

:func:`read_pairs` gives a :class:`PairFiles`, which has the ArguAna :class:`~.corpus.Corpus`'s interface
(``used(dedup)``, ``deduplicated()``, ``overlap()``, ``paired(split, pool)``, ``counts``, ``dropped``), so the runner
and everything after it read both alike. Every row is one pair, duplicates included (counted in ``counts``), as
ArguAna's twin debates are. Whatever cannot be used is a :class:`PairsError`: one line naming the file, the line (or
row) and the fix. :func:`export_pairs` writes an ArguAna corpus as pair files; :func:`data_files` is the provenance
(path, size, sha256 of each file) a run folder records.
"""

from __future__ import annotations

import csv
import difflib
import hashlib
import io
import json
import numbers
import os
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from ...errors import BiencoderError
from ..config.schema import PAIR_FORMATS
from ..files import strict_json
from .paired import SPLIT_NAMES, PairedSplit, dedup_keep, split_name

#: suffix -> format (data.format overrides it)
SUFFIXES = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".csv": "csv",
    ".tsv": "tsv",
    ".parquet": "parquet",
    ".pq": "parquet",
}
ROLES = ("anchor", "positive", "negative", "group")
#: fewer pairs than this and no query has a wrong candidate to beat
MIN_PAIRS = 2
#: the file names export_pairs writes (and a folder of pair files holds)
EXPORTED = {name: f"{name}.jsonl" for name in SPLIT_NAMES}


class PairsError(BiencoderError, ValueError):
    """A pair file that cannot be used; the message names the file, the line or row, and the fix."""


# -- which files ------------------------------------------------------------------------------------------------
def data_paths(data) -> dict[str, str]:
    """``{"train": path, "val": path, "test": path}`` (``data.train/val/test``) or ``{"file": path}`` (``data.file``)."""
    if data.get("file"):
        return {"file": str(data["file"])}
    return {name: str(data[name]) for name in SPLIT_NAMES if data.get(name)}


def data_files(data) -> dict[str, dict]:
    """The provenance of a pair-file run: ``{role: {"path", "bytes", "sha256"}}`` per file (``{}`` for the ArguAna
    layout). Raises :class:`PairsError` for a missing file."""
    if data.get("layout", "arguana") != "pairs":
        return {}
    return {
        role: _provenance(Path(path), role, _read_bytes(Path(path), role)) for role, path in data_paths(data).items()
    }


def _provenance(path: Path, role: str, content: bytes) -> dict:
    return {
        "path": str(path.expanduser().resolve()),
        "bytes": len(content),
        "sha256": hashlib.sha256(content).hexdigest(),
    }


def _read_bytes(path: Path, role: str) -> bytes:
    try:
        return path.expanduser().read_bytes()
    except FileNotFoundError:
        raise PairsError(
            f"data.{role}='{path}' does not exist: check the path (data=pairs reads data.train, "
            "data.val and data.test, or data.file)"
        ) from None
    except IsADirectoryError:
        raise PairsError(
            f"data.{role}='{path}' is a folder: name the file itself (e.g. {path}/{role}.jsonl)"
        ) from None
    except OSError as err:
        raise PairsError(f"data.{role}='{path}' cannot be read ({err.strerror}): check the path") from None


def file_format(path: Path, role: str, fmt: str | None = None) -> str:
    """The format of ``path``: ``fmt`` (``data.format``) if given, else from its suffix."""
    if fmt:
        return fmt
    found = SUFFIXES.get(path.suffix.lower())
    if found is None:
        raise PairsError(
            f"data.{role}='{path}': unknown file type '{path.suffix or '(no suffix)'}': use "
            f"{', '.join(SUFFIXES)}, or name the format with data.format={'|'.join(PAIR_FORMATS)}"
        )
    return found


# -- reading one file into raw records ----------------------------------------------------------------------------
@dataclass
class Records:
    """One file's rows as read: ``rows`` (dicts of raw values), ``where`` (``line 7`` / ``row 5`` of each row),
    ``columns`` (every column name found, in order), ``label`` (how messages name the file)."""

    label: str
    rows: list[dict]
    where: list[str]
    columns: list[str]


def _text(content: bytes, label: str) -> str:
    try:
        return content.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = content[: err.start].count(b"\n") + 1
        raise PairsError(
            f"{label} is not UTF-8 ({err.reason} at byte {err.start}, line {line}): re-save it as UTF-8"
        ) from None


def _jsonl(content: bytes, label: str) -> Records:
    rows, where, columns = [], [], {}
    for number, line in enumerate(_text(content, label).splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            if number == 1 and line.lstrip().startswith("["):
                record = []  # a JSON array: said below
            else:
                raise PairsError(f"{label} line {number} is not JSON ({err.msg}): one JSON object per line") from None
        if isinstance(record, list):
            raise PairsError(
                f"{label} holds a JSON array, not JSON Lines: write one object per line, e.g. "
                f"pandas.read_json(path).to_json('pairs.jsonl', orient='records', lines=True)"
            )
        if not isinstance(record, dict):
            raise PairsError(
                f"{label} line {number} is not a JSON object: one object per line, e.g. "
                '{"anchor": "...", "positive": "..."}'
            )
        rows.append(record)
        where.append(f"line {number}")
        columns.update(dict.fromkeys(record))
    return Records(label, rows, where, list(columns))


def _delimited(content: bytes, label: str, delimiter: str) -> Records:
    reader = csv.reader(io.StringIO(_text(content, label), newline=""), delimiter=delimiter)
    rows, where, start = [], [], 1
    try:
        header = next(reader, None)
        if header is None:
            raise PairsError(f"{label} is empty: the first line names the columns (anchor{delimiter}positive)")
        start = reader.line_num + 1
        for fields in reader:
            if fields:
                if len(fields) != len(header):
                    raise PairsError(
                        f"{label} line {start} has {len(fields)} fields, the header has {len(header)}: "
                        'quote a field that holds the delimiter or a line break ("...")'
                    )
                rows.append(dict(zip(header, fields)))
                where.append(f"line {start}")
            start = reader.line_num + 1
    except csv.Error as err:
        raise PairsError(f"{label} line {start}: {err}: fix the quoting of that line") from None
    return Records(label, rows, where, header)


def _parquet(path: Path, label: str) -> Records:
    try:
        frame = pd.read_parquet(path)
    except ImportError:
        raise PairsError(
            f"{label}: reading Parquet needs pyarrow: pip install 'biencoder[parquet]' (or convert the file to .jsonl)"
        ) from None
    except Exception as err:  # noqa: BLE001 - pyarrow raises several types for a file that is not Parquet
        raise PairsError(
            f"{label} cannot be read as Parquet ({type(err).__name__}): check the file, or set "
            "data.format to its real format"
        ) from None
    frame = frame.astype(object).where(frame.notna(), None)
    return Records(
        label,
        frame.to_dict("records"),
        [f"row {i}" for i in range(1, len(frame) + 1)],
        [str(c) for c in frame.columns],
    )


def read_records(path: Path, role: str, fmt: str | None = None) -> tuple[Records, dict]:
    """(records of ``path``, its provenance): one file read once, whatever its format."""
    content = _read_bytes(path, role)
    kind, label = file_format(path, role, fmt), f"'{path}'"
    if kind == "jsonl":
        records = _jsonl(content, label)
    elif kind in ("csv", "tsv"):
        records = _delimited(content, label, "," if kind == "csv" else "\t")
    else:
        records = _parquet(path.expanduser(), label)
    return records, _provenance(path, role, content)


# -- from records to pairs ------------------------------------------------------------------------------------------
def resolve_columns(records: Records, mapping: dict, extra: tuple[str, ...] = ()) -> dict[str, str | None]:
    """role -> the column read for it (None: the optional column is absent or switched off with null). A required
    column, or an optional one named by a mapping, that the file lacks is a :class:`PairsError` listing the columns
    found, with the closest one."""
    defaults = {"anchor": "anchor", "positive": "positive", "negative": "negative", "group": "group", "split": "split"}
    out = {}
    for role in ROLES + extra:
        name = mapping.get(role, defaults[role])
        if name is None or (name not in records.columns and role in ("negative", "group") and name == defaults[role]):
            out[role] = None
            continue
        if name not in records.columns:
            close = difflib.get_close_matches(name, records.columns, n=1, cutoff=0.6)
            hint = f"did you mean '{close[0]}'? " if close else ""
            target = close[0] if close else "<column>"
            raise PairsError(
                f"{records.label} has no column '{name}' (columns: {', '.join(records.columns) or 'none'})"
                f": {hint}rename it, or map it with data.columns.{role}={target}"
            )
        out[role] = name
    if out["anchor"] == out["positive"]:
        raise PairsError(
            f"data.columns.anchor and data.columns.positive both name '{out['anchor']}': map them to two columns"
        )
    return out


def _value(record: dict, column: str, role: str, where: str, records: Records) -> str | None:
    """The stripped text of ``record[column]``; None for an empty optional value. Anything else a text cannot be is
    a :class:`PairsError` naming the line."""
    if column not in record and role != "negative":  # a line without a given negative has none
        raise PairsError(f"{records.label} {where} has no '{column}': give every line the same fields")
    value = record.get(column)
    required = role in ("anchor", "positive")
    if role in ("group", "split") and isinstance(value, numbers.Number) and not isinstance(value, bool):
        value = str(value)  # topic ids are often numbers
    if value is None or (isinstance(value, float) and value != value):  # null, NaN
        value = ""
    if not isinstance(value, str):
        raise PairsError(
            f"{records.label} {where}: '{column}' is {json.dumps(value, default=str)[:40]}, not a text: "
            f"every {role} must be a string"
        )
    value = value.strip()
    if not value and (required or role in ("group", "split")):
        fix = (
            "drop the line or fill it in"
            if required
            else "give every row one, or read none with data.columns.group=null"
            if role == "group"
            else "fill it in"
        )
        raise PairsError(f"{records.label} {where}: '{column}' is empty: every {role} needs text; {fix}")
    return value or None


def pair_table(records: Records, columns: dict[str, str | None], split: str | None = None) -> pd.DataFrame:
    """One row per record: split, anchor, positive, negative, group (None where absent), source, where. ``split``:
    the split of every row (one file per split), else each row's ``split`` column."""
    rows = []
    for record, where in zip(records.rows, records.where):
        values = {role: _value(record, col, role, where, records) if col else None for role, col in columns.items()}
        if values["negative"] is not None and values["negative"] in (values["anchor"], values["positive"]):
            same = "positive" if values["negative"] == values["positive"] else "anchor"
            raise PairsError(
                f"{records.label} {where}: the negative equals its {same}: a given negative must be "
                "another text; fix it or leave it empty"
            )
        rows.append(
            {
                "split": split or _split_of(values.pop("split", None), records.label, where),
                **{role: values[role] for role in ROLES},
                "source": records.label,
                "where": where,
            }
        )
    return pd.DataFrame(rows, columns=["split", *ROLES, "source", "where"])


def _split_of(value: str, label: str, where: str) -> str:
    try:
        return split_name(value)
    except BiencoderError:
        raise PairsError(
            f"{label} {where}: split '{value}' is not train, val or test (training and validation are "
            "accepted too): fix the split column"
        ) from None


def read_pairs(data) -> "PairFiles":
    """Read the pair files a ``data`` config names (``train``/``val``/``test`` or ``file``, ``format``, ``columns``;
    a DictConfig or a dict) into a :class:`PairFiles` with the official splits (``data.dedup`` is
    :meth:`PairFiles.used`'s). Raises :class:`PairsError` on anything listed in the module docstring."""
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
        used = resolve_columns(records, mapping, ("split",) if role == "file" else ())
        tables.append(pair_table(records, used, None if role == "file" else role))
        grouped[records.label] = used["group"] is not None
    if len(set(grouped.values())) > 1:
        with_group = [label for label, has in grouped.items() if has]
        without = [label for label, has in grouped.items() if not has]
        raise PairsError(
            f"{with_group[0]} has a group column and {without[0]} has none: give every file one, or "
            "read none with data.columns.group=null"
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

    def deduplicated(self, check: bool = True) -> "PairFiles":
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

    def used(self, dedup: bool) -> "PairFiles":
        """The pairs a run uses: :meth:`deduplicated` when ``dedup`` (``data.dedup``), else the files' splits."""
        return self.deduplicated() if dedup else self

    def overlap(self) -> dict[str, dict[str, int]]:
        """Cross-split overlap per ordered pair of splits ``a->b`` (and ``test->train+val``): the pairs of a whose
        anchor and positive occur together as a pair of b, and the distinct texts of a found in b."""
        pair_set = {s: set(zip(self.split_pairs(s)["anchor"], self.split_pairs(s)["positive"])) for s in SPLIT_NAMES}
        targets = [(a, (b,)) for a in SPLIT_NAMES for b in SPLIT_NAMES if a != b] + [("test", ("train", "val"))]
        out = {}
        for a, bs in targets:
            pairs_b = set().union(*(pair_set[b] for b in bs))
            texts_b = set().union(*(self.texts(b) for b in bs))
            pairs_a = self.split_pairs(a)
            out[f"{a}->{'+'.join(bs)}"] = {
                "pairs": sum(pair in pairs_b for pair in zip(pairs_a["anchor"], pairs_a["positive"])),
                "of_pairs": len(pairs_a),
                "texts": len(self.texts(a) & texts_b),
                "of_texts": len(self.texts(a)),
            }
        return out

    def paired(self, split: str, pool: str = "all") -> PairedSplit:
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
            for a, p, t, d in zip(pairs["point_text"], pairs["counter_text"], pairs["theme"], pairs["debate"])
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
