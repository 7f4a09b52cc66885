"""One pair file read and checked, row by row (``data=pairs``; docs/own-data.md): which files a ``data`` config names
(:func:`data_paths`), their provenance (:func:`data_files`: path, size, sha256 of each, which a run folder records),
each file's raw rows whatever its format (:func:`read_records`: JSON Lines, CSV, TSV or Parquet, from the suffix or
``data.format``), the column of each role (:func:`resolve_columns`) and the checked pairs of one file
(:func:`pair_table`). Whatever cannot be used is a :class:`PairsError`: one line naming the file, the line (or row)
and the fix. The files as a corpus are :mod:`.pair_files`.
"""

from __future__ import annotations

import csv
import difflib
import hashlib
import io
import json
import numbers
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ...errors import BiencoderError
from ..config.schema import PAIR_FORMATS
from .paired import SPLIT_NAMES, split_name

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


class PairsError(BiencoderError, ValueError):
    """A pair file that cannot be used; the message names the file, the line or row, and the fix."""


# -- which files ------------------------------------------------------------------------------------------------
def data_paths(data) -> dict[str, str]:
    """``{"train": path, "val": path, "test": path}`` (``data.train/val/test``) or ``{"file": path}``
    (``data.file``)."""
    if data.get("file"):
        return {"file": str(data["file"])}
    return {name: str(data[name]) for name in SPLIT_NAMES if data.get(name)}


def data_files(data) -> dict[str, dict]:
    """The provenance of a pair-file run: ``{role: {"path", "bytes", "sha256"}}`` per file (``{}`` for the ArguAna
    layout; a BEIR folder's: corpus, queries and each split's qrels, :func:`.beir.beir_files`). Raises
    :class:`PairsError` for a missing pair file."""
    if data.get("layout", "arguana") == "beir":
        return beir_files(data["root"])
    if data.get("layout", "arguana") != "pairs":
        return {}
    return {
        role: _provenance(Path(path), role, _read_bytes(Path(path), role)) for role, path in data_paths(data).items()
    }


#: the files of a BEIR folder by role (:mod:`.beir` reads them); a split's qrels file may be missing
BEIR_FILES = {
    "corpus": "corpus.jsonl",
    "queries": "queries.jsonl",
    "train": "qrels/train.tsv",
    "val": "qrels/dev.tsv",
    "test": "qrels/test.tsv",
}


def beir_files(root: str | Path) -> dict[str, dict]:
    """The provenance of a BEIR run: path, size and sha256 of each file of :data:`BEIR_FILES` under ``root`` there is
    (the files missing are left out: the reader names them)."""
    paths = {role: Path(root).expanduser() / name for role, name in BEIR_FILES.items()}
    return {role: _provenance(path, role, path.read_bytes()) for role, path in paths.items() if path.is_file()}


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
                rows.append(dict(zip(header, fields, strict=True)))
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
def resolve_columns(
    records: Records, mapping: dict, extra: tuple[str, ...] = (), option: str = "data.columns."
) -> dict[str, str | None]:
    """role -> the column read for it (None: the optional column is absent or switched off with null). A file with
    no records is a :class:`PairsError` saying so; a required column, or an optional one named by a mapping, that the
    file lacks is one listing the columns found, with the closest one and the override that maps it (``option``: the
    caller's spelling, ``data.columns.`` for a run, ``--column `` for ``biencoder-corpus stats``)."""
    if not records.rows:
        raise PairsError(f"{records.label} is empty (no records): write one pair per line or row, then read it again")
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
                f": {hint}rename it, or map it with {option}{role}={target}"
            )
        out[role] = name
    if out["anchor"] == out["positive"]:
        raise PairsError(f"{option}anchor and {option}positive both name '{out['anchor']}': map them to two columns")
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
    for record, where in zip(records.rows, records.where, strict=True):
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
