"""Files written whole and as strict JSON: every file the package writes goes through here.

* A file is written to a temporary name in the same folder and renamed over the target, so a reader sees the old
  file or the new one, never half of one (:func:`write_text_atomic`, :func:`write_json_atomic`, :func:`save_atomic`,
  :func:`save_npy_atomic`).
* Every JSON text the package writes is strict JSON (RFC 8259: no ``NaN`` or ``Infinity``, which jq, JavaScript and
  many loggers refuse) through :func:`strict_json`: a non-finite number is written as ``null`` and named, with the
  reason, in the record's ``non_finite`` key (``{"/loss_parts/loss": "NaN"}``, JSON Pointers). :func:`read_json`
  reads both these records and those written with bare ``NaN`` before, into the same Python values.
* A checkpoint can be written off the calling thread (:class:`BackgroundWriter`): the caller pays for a copy
  (:class:`HostCopier`), a thread for the atomic write.
"""

from __future__ import annotations

import copy
import gzip
import io
import json
import logging
import math
import os
import threading
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

log = logging.getLogger("biencoder")

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
        raise ValueError(
            f"non-finite values {found} outside a record, or in a record with a '{NON_FINITE}' key "
            "already: strict JSON cannot say which they were"
        )
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
    """Write ``text`` (UTF-8) so that a reader never sees half a file (temp file + fsync + rename); gzipped when
    ``path`` ends in ``.gz`` (:func:`gzip_bytes`)."""
    data = text.encode()
    _replace_atomic(path, lambda f: f.write(gzip_bytes(data) if Path(path).suffix == ".gz" else data))


def gzip_bytes(data: bytes) -> bytes:
    """``data`` as a gzip file with no name and no time in its header, so the same text gives the same bytes on any
    Python (gzip.compress writes another OS byte on some versions) with the same zlib."""
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0, compresslevel=6) as file:
        file.write(data)
    return buffer.getvalue()


def write_json_atomic(path: Path, obj: dict) -> None:
    """Write strict JSON (:func:`strict_json`, indent 2, no final newline) so that a reader never sees half a file."""
    write_text_atomic(path, strict_json(obj, indent=2))


def save_atomic(obj, path: Path) -> None:
    """``torch.save`` to a temp file, then rename: a kill mid-save leaves the previous checkpoint intact."""
    _replace_atomic(path, lambda f: torch.save(obj, f))


def host_copy(obj: Any) -> Any:
    """A copy of ``obj`` that shares no memory with it (:meth:`HostCopier.copy`, with memory of its own)."""
    return HostCopier().copy(obj)


class HostCopier:
    """Copies of objects that share no memory with them, for a write that runs while the originals change; the CPU
    memory of the copies is the copier's, reused by later copies once :meth:`release` says nothing reads it any more
    (so a copy per epoch does not fault in fresh pages, or pin fresh memory, every time)."""

    def __init__(self):
        self._free: dict[tuple, list[torch.Tensor]] = defaultdict(list)  # (shape, dtype, pinned) -> reusable
        self._held: list[tuple[tuple, torch.Tensor]] = []  # the tensors of the copies made since release()

    def copy(self, obj: Any) -> Any:
        """``obj`` with every tensor copied into CPU memory of this copier (contiguous, same shape and dtype,
        detached); every numpy array copied; dicts (their type kept), lists and tuples rebuilt around the copies of
        their items; numbers, strings, bytes and None kept (immutable). A CUDA tensor goes into pinned memory by a
        non-blocking copy, and every device copied from is synchronised before this returns, so the copy is
        complete when it is handed to another thread; other tensors are copied the same way, blocking.

        Raises TypeError for any other object (a checkpoint holds only what ``torch.load(weights_only=True)`` reads).
        """
        devices: set[torch.device] = set()
        out = self._copy(obj, devices)
        for device in devices:
            torch.cuda.synchronize(device)  # the non-blocking copies from it are done
        return out

    def release(self) -> None:
        """The copies made so far are read by nobody any more: later copies may overwrite their memory."""
        for key, tensor in self._held:
            self._free[key].append(tensor)
        self._held = []

    def _copy(self, obj: Any, devices: set[torch.device]) -> Any:
        if isinstance(obj, torch.Tensor):
            return self._tensor(obj.detach(), devices)
        if isinstance(obj, np.ndarray):
            return obj.copy()
        if isinstance(obj, dict):
            out = copy.copy(obj)  # the same type (an OrderedDict state dict keeps its _metadata)
            for key, value in obj.items():
                out[key] = self._copy(value, devices)
            return out
        if type(obj) in (list, tuple):
            return type(obj)(self._copy(item, devices) for item in obj)
        if obj is None or isinstance(
            obj, (bool, int, float, complex, str, bytes, np.generic, torch.dtype, torch.Size)
        ):
            return obj
        raise TypeError(f"cannot copy a {type(obj).__name__} for a background write: only tensors, arrays, containers")

    def _tensor(self, tensor: torch.Tensor, devices: set[torch.device]) -> torch.Tensor:
        cuda = tensor.device.type == "cuda"
        key = (tensor.shape, tensor.dtype, cuda)
        free = self._free[key]
        out = free.pop() if free else torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=cuda)
        self._held.append((key, out))
        out.copy_(tensor, non_blocking=cuda)
        if cuda:
            devices.add(tensor.device)
        return out


class BackgroundWriter:
    """Writes ``path`` with :func:`save_atomic` in a background thread, one write at a time.

    :meth:`submit` copies the object (:class:`HostCopier`: nothing the caller changes afterwards is written), starts
    the write and returns; :meth:`wait` returns once no write is in flight. An error of a write (any exception in
    the thread) is raised by the next :meth:`wait` or :meth:`submit`, once. A kill at any point leaves ``path`` as
    the last finished write left it (the write is :func:`save_atomic`'s). The writer keeps the memory of its last
    copy for the next one until :meth:`close`. Meant for one calling thread; a write still in flight when the
    interpreter exits is finished first (the thread is not a daemon).
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._copier = HostCopier()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(self, obj: Any) -> None:
        """Wait for the write in flight (raising its error), copy ``obj``, and start writing the copy."""
        self.wait()
        snapshot = self._copier.copy(obj)
        self._thread = threading.Thread(target=self._write, args=(snapshot,), name=f"write {self.path.name}")
        self._thread.start()

    def wait(self) -> None:
        """Return when no write is in flight; raise the error of a write that failed since the last wait."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            self._copier.release()  # the thread that read the copy has ended
        error, self._error = self._error, None
        if error is not None:
            raise error

    @contextmanager
    def waiting_on_error(self) -> Iterator[None]:
        """Around code that calls :meth:`submit`: when it ends by an exception, the write in flight is waited for
        before the exception propagates (so that what the caller does next, a record that the run failed, comes
        after it); an error of that write is then logged, and the block's own exception is the one raised."""
        try:
            yield
        except BaseException:
            try:
                self.wait()
            except Exception as err:  # noqa: BLE001 - reported here, the block's own error goes on
                log.error("writing %s failed as well: %s: %s", self.path, type(err).__name__, err)
            raise

    def close(self) -> None:
        """:meth:`wait`, then let go of the copy's memory (a later :meth:`submit` allocates anew)."""
        try:
            self.wait()
        finally:
            self._copier = HostCopier()

    def _write(self, snapshot: Any) -> None:
        try:
            save_atomic(snapshot, self.path)
        except BaseException as err:  # noqa: BLE001 - handed to the calling thread by wait()
            self._error = err


def save_npy_atomic(path: Path, array: np.ndarray) -> None:
    _replace_atomic(path, lambda f: np.save(f, array))


def save_npz_atomic(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """``np.savez_compressed`` of ``arrays`` so that a reader never sees half a file."""
    _replace_atomic(path, lambda f: np.savez_compressed(f, **arrays))
