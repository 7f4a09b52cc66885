"""The records of a run folder that must survive a kill: ``metrics.jsonl`` and ``final.json``.

``metrics.jsonl`` is appended one epoch at a time with flush + fsync, so a kill leaves whole lines, except at worst a
torn last line, which :func:`read_metrics` skips and reports instead of crashing. ``final.json`` is written whole
(:func:`~biencoder.engine.files.write_json_atomic`); a folder whose ``final.json`` does not say ``done`` is unfinished.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from ...errors import BiencoderError
from ..files import read_json, strict_json, write_text_atomic

log = logging.getLogger("biencoder")


class RunFolderError(BiencoderError, ValueError):
    """A run folder that cannot be used as asked (e.g. a corrupt file); the message says what to do."""


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
                raise RunFolderError(
                    f"{path} line {number} is not JSON: the file is corrupt, delete the run folder or repair the line"
                ) from None
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
