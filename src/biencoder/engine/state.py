"""Run-folder files that must survive a kill: metrics.jsonl, final.json, last.pt, and the RNG states of a run.

* ``metrics.jsonl`` is appended one epoch at a time with flush + fsync, so a kill leaves whole lines, except at
  worst a torn last line, which :func:`read_metrics` skips and reports instead of crashing.
* Every other file is written to a temporary name in the same folder and renamed over the target, so a reader
  sees the old file or the new one, never half of one.
"""

from __future__ import annotations

import json
import logging
import os
import random
from pathlib import Path

import numpy as np
import torch

from ..errors import BiencoderError

log = logging.getLogger("biencoder")

class RunFolderError(BiencoderError, ValueError):
    """A run folder that cannot be used as asked (e.g. a corrupt file); the message says what to do."""


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
    """Write JSON (indent 2, no final newline) so that a reader never sees half a file."""
    write_text_atomic(path, json.dumps(obj, indent=2))


def save_atomic(obj, path: Path) -> None:
    """``torch.save`` to a temp file, then rename: a kill mid-save leaves the previous checkpoint intact."""
    _replace_atomic(path, lambda f: torch.save(obj, f))


def save_npy_atomic(path: Path, array: np.ndarray) -> None:
    _replace_atomic(path, lambda f: np.save(f, array))


def append_rows(path: Path, rows: list[dict]) -> None:
    """Append rows as JSON lines in one write, flushed and fsynced (an epoch is on disk once this returns)."""
    with open(path, "a", encoding="utf-8") as file:
        file.write("".join(json.dumps(row) + "\n" for row in rows))
        file.flush()
        os.fsync(file.fileno())


def read_metrics(path: Path) -> tuple[list[dict], bool]:
    """(rows, torn) of a ``metrics.jsonl``; a torn last line (a kill mid-write) is skipped and reported.

    A bad line anywhere else is corruption, not a kill: :class:`RunFolderError` naming the line.
    """
    lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    rows, torn = [], False
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
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
        write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in keep))
    return len(rows) - len(keep)


def read_final(folder: Path) -> dict | None:
    """``final.json`` of a run folder, or None when absent or unreadable (an unfinished run)."""
    try:
        return json.loads((Path(folder) / "final.json").read_text())
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
