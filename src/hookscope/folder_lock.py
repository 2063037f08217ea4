"""One writer per folder: an advisory lock held for as long as the writer lives.

A run folder being written (``hookscope train``, :class:`~hookscope.callbacks.RunFolder`, ``hs.watch(path=)``)
and a checkpoint folder in use are locked through a file beside them, ``.<name>.lock``: the writer holds
an exclusive ``fcntl.flock`` on it and writes into it who it is (pid, host, start time, command). A second
writer is refused in one line naming the holder and since when.

A writer that dies, even by ``kill -9``, loses its lock with its process: the kernel drops the flock when
the last descriptor closes. The file may stay behind with the dead writer's record; it is then *stale*,
and the next writer takes it over (and can say whose it was). A clean release deletes the file.

What it does not guarantee:

- On a network file system the lock is only as good as the server's: NFSv4 and recent Linux clients map
  ``flock`` to byte-range locks that the server arbitrates, but NFSv3 without a lock manager, some FUSE
  and SMB mounts, or clients with ``local_lock`` set, lock per machine only, so two machines may both
  write. Keep concurrent runs on a local disk, or give each its own folder.
- It is advisory: it stops hookscope writers, not ``rm`` or another program.
- Windows (no ``fcntl``): folders are not locked; a warning says so once.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import warnings
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

_warned_unlocked = False


class FolderBusyError(RuntimeError):
    """Another live process (or another writer in this one) holds the folder's lock."""


def lock_path(folder: str | os.PathLike[str]) -> Path:
    """The lock file of ``folder``: ``.<name>.lock`` beside it (it survives the folder being renamed)."""
    folder = Path(os.path.abspath(Path(folder).expanduser()))
    return folder.with_name(f".{folder.name}.lock")


class FolderLock:
    """The writer's lock on ``folder``; :meth:`acquire` takes it or refuses, :meth:`release` gives it back.

    ``what`` names the folder in messages (``"the run folder"``, ``"the checkpoint folder"``). Acquiring
    twice is a no-op; releasing an unheld lock too. After :meth:`acquire`, ``stale`` holds the record of
    a writer that died holding the lock (None when there was none).
    """

    def __init__(self, folder: str | os.PathLike[str], what: str = "the folder") -> None:
        self._file: IO[str] | None = None
        self._created: list[Path] = []  # the lock file's parent folders this lock made, deepest first
        self.folder = Path(os.path.abspath(Path(folder).expanduser()))
        self.path = lock_path(self.folder)
        self.what = what
        self.stale: dict[str, Any] | None = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock now."""
        return self._file is not None

    def acquire(self) -> FolderLock:
        """Take the lock, or raise :class:`FolderBusyError` naming who holds it; returns ``self``."""
        if self._file is not None:
            return self
        if fcntl is None:
            _warn_unlocked()
            return self
        while self._file is None:
            self._created = _make_parents(self.path.parent)
            try:
                file = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 — held for the writer's life
            except FileNotFoundError:  # another writer's release removed the empty parent: make it again
                continue
            try:
                fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _record(file)
                file.close()
                raise FolderBusyError(self.busy_message(holder)) from None
            if _is_current(file, self.path):
                self._file = file
            else:  # the holder released (and deleted) the file between our open and our lock: again
                file.close()
        self.stale = _record(self._file)
        self._write_record()
        return self

    def take_over(self, other: FolderLock) -> None:
        """Hold what ``other`` holds — the lock of the same folder — with no moment unlocked in between:
        a caller that locked a folder early hands the lock to the writer it builds later."""
        if other.path != self.path:
            raise ValueError(f"FolderLock.take_over: {other.path} is not {self.path}; lock the same folder")
        self.release()
        self._file, other._file = other._file, None
        self._created, other._created = other._created, []
        self.stale = other.stale

    def release(self) -> None:
        """Delete the lock file and drop the lock (deleting first, so no one locks a file on its way out)."""
        file, self._file = self._file, None
        if file is None:
            return
        if _is_current(file, self.path):
            self.path.unlink(missing_ok=True)
        file.close()
        for folder in self._created:  # a refused or empty run leaves no folder behind
            try:
                folder.rmdir()
            except OSError:  # not empty: the run (or another) wrote there
                break

    def _write_record(self) -> None:
        assert self._file is not None
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(sys.argv),
        }
        self._file.seek(0)
        self._file.truncate()
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def busy_message(self, holder: dict[str, Any] | None) -> str:
        """The one-line refusal naming ``holder``, the record of the writer holding the lock."""
        who = describe(holder) if holder else "another writer (it has not written its record yet)"
        return (
            f"{self.what} {self.folder} is in use by {who}; wait for it to finish or choose another folder "
            f"(a live run is never replaced, also not with --overwrite / overwrite=True)"
        )

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # a writer that forgot its lock: the process keeps no stale one
            self.release()


@contextlib.contextmanager
def exclusive(path: str | os.PathLike[str]) -> Iterator[None]:
    """Hold an exclusive lock on the file ``path`` for the block, waiting for it: one process at a time
    through a short critical section (creating a shared database's tables). The file is left in place."""
    if fcntl is None:
        _warn_unlocked()
        yield
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as file:
        fcntl.flock(file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(file, fcntl.LOCK_UN)


def describe(record: dict[str, Any]) -> str:
    """``pid 123 on host since 2026-01-01T10:00:00+00:00`` from a lock record."""
    return f"pid {record.get('pid')} on {record.get('host')} since {record.get('started')}"


def holder(folder: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The record of the live writer of ``folder``, or None when none is writing (a stale lock is none).

    A peek, not a lock: the writer's own :meth:`FolderLock.acquire` decides. A record from another host
    counts as live, since this machine cannot see that host's processes.
    """
    path = lock_path(folder)
    try:
        with open(path, encoding="utf-8") as file:
            record = _record(file)
    except OSError:
        return None
    if record is None:
        return None
    if record.get("host") == socket.gethostname() and not _alive(record.get("pid")):
        return None
    return record


def _make_parents(folder: Path) -> list[Path]:
    """Create ``folder`` and its missing parents; returns those it created, deepest first."""
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    folder.mkdir(parents=True, exist_ok=True)
    return missing


def _record(file: IO[str]) -> dict[str, Any] | None:
    """The JSON record in a lock file, or None when it is empty or partly written."""
    file.seek(0)
    try:
        found = json.loads(file.read() or "null")
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def _is_current(file: IO[str], path: Path) -> bool:
    """Whether ``file`` is still the file at ``path`` (not one a releasing holder has since deleted)."""
    try:
        here = path.stat()
    except FileNotFoundError:
        return False
    mine = os.fstat(file.fileno())
    return (mine.st_dev, mine.st_ino) == (here.st_dev, here.st_ino)


def _alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def _warn_unlocked() -> None:
    global _warned_unlocked
    if not _warned_unlocked:
        _warned_unlocked = True
        warnings.warn(
            "hookscope: folder locks need fcntl, which this system lacks; a second run writing the same "
            "folder is not refused here — give each run its own folder",
            stacklevel=3,
        )
