"""One process writes a run folder at a time (:func:`claim`).

An exclusive ``flock`` on ``<folder>/run.lock``, held on an open file for the whole run (rank 0's, under torchrun),
which the kernel drops when the process ends, however it ends. The holder writes its pid, host and start time into
the file and empties it when it lets go; a claim that finds the lock held ends in :class:`RunFolderBusy` (one line
naming the folder and the holder) having changed nothing; one that finds a record but no lock took over from a holder
that died holding it, and says so in the run's log (:func:`announce_lock`). The claim comes before anything is written
into the folder: in the resolver of ``trainer.resume=<folder>`` and of a sweep job whose folder exists (before Hydra
makes the folder, opens its log or writes ``.hydra/``), else first thing in the app and in
:func:`~biencoder.engine.training.run.run`. ``run.lock`` is removed only by the process that created it, only on
the bad-input clean-up (:func:`~biencoder.engine.runs.folder.discard_if_ours`, through :func:`own_lock_file`), and a
claim checks that the file it locked is still the one at the path, so a removal never lets two processes hold the
folder. The tests are ``tests/engine/runs/test_lock.py``.
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import logging
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from ..files import read_json, strict_json
from ..machine import distributed
from .records import RunFolderError

log = logging.getLogger("biencoder")

#: the file whose flock says which process writes the run folder (:func:`claim`)
LOCK_NAME = "run.lock"


class RunFolderBusy(RunFolderError):
    """The run folder is held by another process (:func:`claim`); the message names the folder and the holder."""


@dataclass
class FolderLock:
    """This process's hold on a run folder: the open ``run.lock`` (its flock lives as long as ``fd``)."""

    path: Path
    fd: int
    created: bool  # this process created run.lock (it may remove it again on the bad-input clean-up)
    stale: dict | None = None  # the record of a holder that ended without letting go, until it is logged
    unsupported: str | None = None  # why the file system refused the lock (the run goes on unlocked), until logged


#: real folder path (every symlink resolved: one key however the folder is named) -> this process's hold on it
_HELD: dict[str, FolderLock] = {}
#: errors of flock that mean "this file system has no locks", not "someone holds it" (Lustre mounted noflock: ENOSYS;
#: NFS without a reachable lock manager: ENOLCK)
_NO_LOCKS = {errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK}


def writes_run_folders() -> bool:
    """Whether this process writes run folders: not a torchrun worker of rank > 0 (torchrun sets ``RANK`` before the
    process group starts; :func:`~biencoder.engine.machine.distributed.is_main` once it has)."""
    if distributed.world_size() > 1:
        return distributed.is_main()
    return int(os.environ.get("RANK", "0")) == 0


def claim(path: str | Path) -> bool:
    """Hold the run folder ``path`` for this process until :func:`release` (or the process's end), creating the folder
    and its ``run.lock`` if needed. Returns True when this call took it, False when this process held it already.

    Raises :class:`RunFolderBusy` when another process holds it (nothing is changed: ``run.lock`` is opened as it is,
    never truncated, and read), :class:`RunFolderError` when the lock file cannot be opened. A file system without
    locks is noted (:attr:`FolderLock.unsupported`) and the run goes on unlocked, as before locks existed."""
    key = os.path.realpath(path)
    if key in _HELD:
        return False
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    lock_file = folder / LOCK_NAME
    while True:
        fd, created = _open_lock(lock_file)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_record(fd, wait=True)
            os.close(fd)
            raise RunFolderBusy(
                f"{folder} is in use by {_describe(holder)}: one process writes a run folder at a "
                "time; wait until that run ends (or stop it), then resume again"
            ) from None
        except OSError as err:
            if err.errno not in _NO_LOCKS:
                os.close(fd)
                raise RunFolderError(
                    f"cannot lock {lock_file} ({err.strerror}): the run folder must be on a file "
                    "system that allows locks, or free it of whatever refuses them"
                ) from None
            lock = FolderLock(folder, fd, created, unsupported=err.strerror or str(err))
            break
        if not _same_file(fd, lock_file):  # removed by its creator while we waited: lock the one at the path
            os.close(fd)
            continue
        lock = FolderLock(folder, fd, created, stale=_read_record(fd))
        break
    record = (
        strict_json({"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S %z")})
        + "\n"
    )
    os.pwrite(fd, record.encode(), 0)  # then cut to length: a reader sees a whole record, never an empty file
    os.ftruncate(fd, len(record.encode()))
    _HELD[key] = lock
    return True


def release(path: str | Path) -> None:
    """Let go of ``path`` if this process holds it: its record is emptied (the next holder takes over nothing stale)
    and the lock dropped. The file stays, so no other process can lock a file no longer at the path."""
    lock = _HELD.pop(os.path.realpath(path), None)
    if lock is None:
        return
    try:
        os.ftruncate(lock.fd, 0)
        fcntl.flock(lock.fd, fcntl.LOCK_UN)
    except OSError:
        pass  # the lock goes with the file descriptor anyway
    finally:
        os.close(lock.fd)


@atexit.register
def _release_all() -> None:
    for key in list(_HELD):
        release(key)


def _open_lock(lock_file: Path) -> tuple[int, bool]:
    """(file descriptor, whether this call created the file): an existing ``run.lock`` is opened unchanged."""
    while True:
        for flags, created in ((os.O_RDWR | os.O_CREAT | os.O_EXCL, True), (os.O_RDWR, False)):
            try:
                return os.open(lock_file, flags, 0o644), created
            except (FileExistsError, FileNotFoundError):
                continue  # made (or removed) by another process meanwhile: the other way
            except OSError as err:
                raise RunFolderError(
                    f"cannot open {lock_file} ({err.strerror}): the run folder must be writable"
                ) from None


def _same_file(fd: int, lock_file: Path) -> bool:
    try:
        here, there = os.fstat(fd), os.stat(lock_file)
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _read_record(fd: int, wait: bool = False) -> dict | None:
    """The holder's record in ``run.lock``, or None when there is none (``wait``: give a holder that has just taken the
    lock a moment to write it)."""
    for _ in range(10 if wait else 1):
        text = os.pread(fd, 4096, 0).decode(errors="replace").strip()
        if text:
            try:
                record = read_json(text)
            except ValueError:
                return {}
            return record if isinstance(record, dict) else {}
        if wait:
            time.sleep(0.05)
    return None


def _describe(holder: dict | None) -> str:
    if not holder:
        return "another process (its pid, host and start time not recorded)"
    return f"pid {holder.get('pid', '?')} on {holder.get('host', '?')} since {holder.get('since', '?')}"


def announce_lock(path: str | Path) -> None:
    """Log once, into the run's log, what :func:`claim` found: a stale lock taken over, or a file system without
    locks."""
    lock = _HELD.get(os.path.realpath(path))
    if lock is None:
        return
    if lock.stale is not None:
        elsewhere = lock.stale.get("host") not in (None, socket.gethostname())
        log.warning(
            "%s: took over a stale lock: %s ended without letting go of it (killed?)%s",
            lock.path,
            _describe(lock.stale),
            "; if that process still runs, this file system does not share locks between hosts: stop one of them"
            if elsewhere
            else "",
        )
    if lock.unsupported is not None:
        log.warning(
            "%s: the file system refused a lock (%s): nothing stops a second process from writing this run "
            "folder at the same time",
            lock.path,
            lock.unsupported,
        )
    lock.stale = lock.unsupported = None


def own_lock_file(folder: Path) -> Path | None:
    """``folder``'s ``run.lock`` when this process created it and holds it, and it is still the file at the path (so
    the bad-input clean-up may remove it); else None."""
    lock = _HELD.get(os.path.realpath(folder))
    if lock is not None and lock.created and _same_file(lock.fd, folder / LOCK_NAME):
        return folder / LOCK_NAME
    return None


def created_lock(folder: Path) -> bool:
    """Whether this process holds ``folder`` with a ``run.lock`` it created itself."""
    lock = _HELD.get(os.path.realpath(folder))
    return lock is not None and lock.created
