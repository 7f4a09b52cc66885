"""Run-folder files that must survive a kill: metrics.jsonl, final.json, last.pt, and the RNG states of a run.

* ``metrics.jsonl`` is appended one epoch at a time with flush + fsync, so a kill leaves whole lines, except at
  worst a torn last line, which :func:`read_metrics` skips and reports instead of crashing.
* Every other file is written to a temporary name in the same folder and renamed over the target, so a reader
  sees the old file or the new one, never half of one.
* Every JSON text the package writes is strict JSON (RFC 8259: no ``NaN`` or ``Infinity``, which jq, JavaScript and
  many loggers refuse) through :func:`strict_json`: a non-finite number is written as ``null`` and named, with the
  reason, in the record's ``non_finite`` key (``{"/loss_parts/loss": "NaN"}``, JSON Pointers). :func:`read_json`
  reads both these records and those written with bare ``NaN`` before, into the same Python values.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import BiencoderError

log = logging.getLogger("biencoder")

class RunFolderError(BiencoderError, ValueError):
    """A run folder that cannot be used as asked (e.g. a corrupt file); the message says what to do."""


#: the key of a written record that names its non-finite values (JSON Pointer -> how JSON5/JavaScript spell them)
NON_FINITE = "non_finite"
_SPELLINGS = ("NaN", "Infinity", "-Infinity")


def strict_json(obj: Any, **dumps_kwargs) -> str:
    """``obj`` as strict JSON text (``json.dumps`` with ``allow_nan=False`` and ``dumps_kwargs``).

    ``obj`` is a record (a dict) or a list of records. A NaN or infinite float anywhere in a record is written as
    ``null``, and the record gets a :data:`NON_FINITE` key mapping the JSON Pointer of each such value to "NaN",
    "Infinity" or "-Infinity"; a record without one is written exactly as ``json.dumps`` writes it. ValueError for
    a non-finite value outside any record, or for a record that already has the key.
    """
    if isinstance(obj, list):
        return json.dumps([_strict_record(item) for item in obj], allow_nan=False, **dumps_kwargs)
    return json.dumps(_strict_record(obj), allow_nan=False, **dumps_kwargs)


def read_json(text: str) -> Any:
    """The value of a JSON text :func:`strict_json` wrote (non-finite values restored from :data:`NON_FINITE`, the
    key removed), or of one written with bare ``NaN``/``Infinity`` (read as Python reads them): the same values."""
    value = json.loads(text)
    return [_restored(item) for item in value] if isinstance(value, list) else _restored(value)


def _strict_record(record: Any) -> Any:
    found: dict[str, str] = {}
    clean = _finite_or_null(record, "", found)
    if not found:
        return clean
    if not isinstance(clean, dict) or NON_FINITE in clean:
        raise ValueError(f"non-finite values {found} outside a record, or in a record with a '{NON_FINITE}' key "
                         "already: strict JSON cannot say which they were")
    return {**clean, NON_FINITE: found}


def _finite_or_null(value: Any, pointer: str, found: dict[str, str]) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        found[pointer] = "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
        return None
    if isinstance(value, dict):
        return {key: _finite_or_null(item, f"{pointer}/{_escaped(str(key))}", found) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_null(item, f"{pointer}/{i}", found) for i, item in enumerate(value)]
    return value


def _escaped(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")  # RFC 6901


def _restored(record: Any) -> Any:
    marks = record.get(NON_FINITE) if isinstance(record, dict) else None
    if not (isinstance(marks, dict) and all(mark in _SPELLINGS for mark in marks.values())):
        return record
    record = {key: value for key, value in record.items() if key != NON_FINITE}
    for pointer, mark in marks.items():
        *path, last = [token.replace("~1", "/").replace("~0", "~") for token in pointer.split("/")[1:]]
        parent = record
        for token in path:
            parent = parent[int(token)] if isinstance(parent, list) else parent[token]
        parent[int(last) if isinstance(parent, list) else last] = float(mark)
    return record


def _replace_atomic(path: Path, write) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) so that a reader never sees half a file (temp file + fsync + rename)."""
    _replace_atomic(path, lambda f: f.write(text.encode()))


def write_json_atomic(path: Path, obj: dict) -> None:
    """Write strict JSON (:func:`strict_json`, indent 2, no final newline) so that a reader never sees half a file."""
    write_text_atomic(path, strict_json(obj, indent=2))


def save_atomic(obj, path: Path) -> None:
    """``torch.save`` to a temp file, then rename: a kill mid-save leaves the previous checkpoint intact."""
    _replace_atomic(path, lambda f: torch.save(obj, f))


def save_npy_atomic(path: Path, array: np.ndarray) -> None:
    _replace_atomic(path, lambda f: np.save(f, array))


def append_rows(path: Path, rows: list[dict]) -> None:
    """Append rows as JSON lines in one write, flushed and fsynced (an epoch is on disk once this returns)."""
    with open(path, "a", encoding="utf-8") as file:
        file.write("".join(strict_json(row) + "\n" for row in rows))
        file.flush()
        os.fsync(file.fileno())


def read_metrics(path: Path) -> tuple[list[dict], bool]:
    """(rows, torn) of a ``metrics.jsonl`` (each row as :func:`read_json` reads it); a torn last line (a kill
    mid-write) is skipped and reported.

    A bad line anywhere else is corruption, not a kill: :class:`RunFolderError` naming the line.
    """
    lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    rows, torn = [], False
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(read_json(line))
        except json.JSONDecodeError:
            if number == len(lines):
                torn = True
                log.warning("%s: skipping the torn last line %d (the run was killed while writing it)", path, number)
            else:
                raise RunFolderError(f"{path} line {number} is not JSON: the file is corrupt, "
                                     "delete the run folder or repair the line") from None
    return rows, torn


def truncate_metrics(path: Path, last_epoch: int) -> int:
    """Keep only the rows of epochs ``<= last_epoch`` (and no torn line); returns how many rows were dropped."""
    path = Path(path)
    if not path.exists():
        return 0
    rows, torn = read_metrics(path)
    keep = [row for row in rows if row.get("epoch", -1) <= last_epoch]
    if len(keep) != len(rows) or torn:
        write_text_atomic(path, "".join(strict_json(r) + "\n" for r in keep))
    return len(rows) - len(keep)


def read_final(folder: Path) -> dict | None:
    """``final.json`` of a run folder, or None when absent or unreadable (an unfinished run)."""
    try:
        return read_json((Path(folder) / "final.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None


def is_done(folder: Path) -> bool:
    final = read_final(folder)
    return final is not None and final.get("status") == "done"


def rng_states() -> dict:
    """python, numpy (global) and torch (CPU and CUDA) RNG states, in types ``torch.load(weights_only=True)`` reads."""
    np_state = np.random.get_state(legacy=False)
    state = {
        "python": random.getstate(),
        "numpy": {"bit_generator": np_state["bit_generator"], "key": np_state["state"]["key"].tolist(),
                  "pos": int(np_state["state"]["pos"]), "has_gauss": int(np_state["has_gauss"]),
                  "gauss": float(np_state["gauss"])},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_states(state: dict) -> None:
    random.setstate(state["python"])
    n = state["numpy"]
    np.random.set_state({"bit_generator": n["bit_generator"], "has_gauss": n["has_gauss"], "gauss": n["gauss"],
                         "state": {"key": np.array(n["key"], dtype=np.uint32), "pos": n["pos"]}})
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
