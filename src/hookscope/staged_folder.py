"""A folder written under a hidden partial name, renamed into place once complete, and owned by what made it.

Run folders (the :class:`~hookscope.callbacks.RunFolder` callback, ``hookscope train``) and the output
of ``hookscope inspect`` are written this way. Layout of ``runs/<name>/`` after a fit with ``RunFolder``
(or ``hookscope train``)::

    .hookscope      the marker: which kind of folder hookscope wrote here ("train" or "inspect")
    config.json     every option, the command line, library versions, start and end time, status
    metrics.csv     per-epoch rows and per-step rows at a bounded rate (column ``kind``)
    metrics.jsonl   the same rows, one JSON object per line
    findings.json   the doctor's findings
    summary.txt     the model summary table; summary.json the same rows for the report
    checkpoints/    last.pt, best.pt, ckpt-<step>.pt
    figures/*.png   curves, statistics, gradient flow, feature maps
    report.html     the self-contained report

Nothing is lost:

- A run is written into the hidden sibling ``.<name>.partial`` and renamed to ``<name>`` only once every
  file is there, so a folder called ``<name>`` is always complete.
- A folder is replaced only when hookscope wrote it (its ``.hookscope`` marker), it is of the same kind,
  and the caller said so (``overwrite``); a folder hookscope did not write, or the folder the user is in,
  is never replaced.
- One writer per run: from its start to its rename into place a run holds the lock ``.<name>.lock``
  beside the folder (:mod:`hookscope.folder_lock`). A second writer — a fresh run, an ``overwrite``, a
  resume — is refused in one line naming the holder (pid, host, since when); a live run is never
  replaced.
- An interrupted run stays ``.<name>.partial``; starting the same run again refuses and says how to resume
  it (or start over with ``overwrite``) instead of deleting it. A run whose writer died (its lock is
  stale) is such an unfinished run; while its writer lives it is in use, not unfinished.
- Resuming a finished run copies it with hard links (the files are replaced atomically, never written in
  place, so the original stays intact until the resumed run finishes).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hookscope.folder_lock import FolderBusyError, FolderLock, describe, holder

CONFIG = "config.json"
MARKER = ".hookscope"
PARTIAL_SUFFIX = ".partial"


class RunFolderError(Exception):
    """The run folder given is not usable (exists with other files, not a run); the message says why."""


class RunFolderWriteError(RunFolderError):
    """The file system refused to create or copy the run folder (permissions, a file in the way)."""


class RunFolderBusyError(RunFolderError, FolderBusyError):
    """Another live writer holds the run folder's lock; the message names it and since when."""


def read_json(path: str | Path) -> Any:
    """Read a JSON file, with a one-line error naming the file when it is missing or malformed."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RunFolderError(f"{path} does not exist; is {path.parent} a hookscope run folder?") from None
    except json.JSONDecodeError as err:
        raise RunFolderError(f"{path} is not valid JSON ({err}); rerun the command that wrote it") from None


def folder_kind(folder: Path) -> str | None:
    """The kind hookscope recorded in ``folder`` ("train", "inspect"), or None when hookscope did not write
    it. Run folders from before the marker are known by their config.json naming hookscope's version."""
    marker = _read(folder / MARKER)
    if marker is not None:
        return marker.get("kind")
    config = _read(folder / CONFIG)
    return "train" if config is not None and "hookscope" in config.get("versions", {}) else None


def _read(path: Path) -> dict[str, Any] | None:
    """A JSON object from ``path``, or None when it is missing, unreadable or not an object."""
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


class StagedFolder:
    """Where one run writes its files: ``path`` is the hidden partial folder until :meth:`finish`."""

    def __init__(self, final: Path, path: Path, lock: FolderLock | None = None) -> None:
        self.final = final
        self.path = path
        self.lock = lock

    @classmethod
    def lock_for(cls, path: str | Path) -> FolderLock:
        """The (not yet acquired) writer's lock of the run at ``path`` — its final or partial name."""
        return FolderLock(cls.paths(path)[0], "the run folder")

    @staticmethod
    def acquire(lock: FolderLock) -> FolderLock:
        """Take ``lock``, or refuse with :class:`RunFolderBusyError` naming the live writer holding it."""
        try:
            return lock.acquire()
        except FolderBusyError as err:
            raise RunFolderBusyError(str(err)) from None
        except OSError as err:
            raise _unwritable(lock.folder, err) from None

    @staticmethod
    def paths(path: str | Path) -> tuple[Path, Path]:
        """``(final, partial)`` for ``path``, which may name either of them."""
        given = _absolute(path)
        if given.name.startswith(".") and given.name.endswith(PARTIAL_SUFFIX):
            return given.with_name(given.name[1 : -len(PARTIAL_SUFFIX)]), given
        return given, _partial_path(given)

    @classmethod
    def check_owner(cls, path: str | Path, kind: str) -> None:
        """Refuse ``path`` when writing there could touch what hookscope did not write: the current folder
        or one above it, a folder without hookscope's marker, or a hookscope folder of another kind."""
        final, _ = cls.paths(path)
        here = _absolute(Path.cwd())
        if final == here or final in here.parents:
            raise RunFolderError(
                f"--out {final} is the folder you are in (or holds it); a run folder replaces its --out, "
                "so give a new folder such as runs/<name>"
            )
        if not final.exists() or _is_empty_dir(final):
            return
        owner = folder_kind(final)
        if owner is None:
            raise RunFolderError(
                f"--out {final} already exists and hookscope did not write it (no {MARKER} marker); "
                "choose another --out, or move it away yourself"
            )
        if owner != kind:
            raise RunFolderError(
                f"--out {final} holds a hookscope {owner} folder, not {kind} output; choose another --out"
            )

    @classmethod
    def check_start(
        cls, path: str | Path, kind: str, overwrite: bool = False, lock: FolderLock | None = None
    ) -> None:
        """Refuse to start a fresh ``kind`` run at ``path`` that another live writer is writing (always),
        that would replace a run (unless ``overwrite``) or delete an unfinished one (it can be resumed
        instead). ``lock``: the lock on ``path`` the caller took (without one, the lock is peeked)."""
        cls.check_owner(path, kind)
        final, partial = cls.paths(path)
        writer = holder(final) if lock is None else None
        if writer is not None:
            raise RunFolderBusyError(cls.lock_for(final).busy_message(writer))
        if overwrite:
            return
        if kind == "train" and (partial / CONFIG).is_file():
            gone = lock.stale if lock is not None else None
            died = f" (its writer, {describe(gone)}, is gone)" if gone else ""
            raise RunFolderError(
                f"{partial} holds an unfinished run of --out {final}{died}; continue it with "
                f"`hookscope train --resume {partial}` (Python: fit(n, resume='{partial}')), or start over "
                "with --overwrite (Python: RunFolder(..., overwrite=True))"
            )
        if final.exists() and not _is_empty_dir(final):
            raise RunFolderError(
                f"--out {final} already holds a hookscope {kind} run; pass --overwrite to replace it "
                "(Python: RunFolder(..., overwrite=True)), or choose another --out"
            )

    @classmethod
    def start(
        cls, path: str | Path, kind: str = "train", overwrite: bool = False, lock: FolderLock | None = None
    ) -> StagedFolder:
        """Begin a fresh ``kind`` run that will end up at ``path`` (see :meth:`check_start`); with
        ``overwrite`` an older run there is replaced at :meth:`finish` and an unfinished one discarded.

        The run's lock (``lock``, or a new one) is taken first and held until :meth:`finish` or
        :meth:`release`; a lock the caller already held stays held when the start is refused."""
        lock = lock or cls.lock_for(path)
        with _held(lock):
            cls.check_start(path, kind, overwrite, lock)
            final, partial = cls.paths(path)
            try:
                if partial.exists():
                    shutil.rmtree(partial)
                partial.mkdir(parents=True)
                (partial / MARKER).write_text(json.dumps({"kind": kind}) + "\n", encoding="utf-8")
            except OSError as err:
                raise _unwritable(final, err) from None
        return cls(final, partial, lock)

    @staticmethod
    def check_run(path: str | Path) -> Path:
        """``path`` as an absolute path, when it holds a run to continue; else a one-line refusal."""
        given = _absolute(path)
        if not (given / CONFIG).is_file():
            raise RunFolderError(
                f"--resume {given} is not a hookscope run folder (no {CONFIG}); "
                "give the folder that `hookscope train` wrote"
            )
        return given

    @classmethod
    def resume(cls, path: str | Path, lock: FolderLock | None = None) -> StagedFolder:
        """Continue the run in ``path``: an interrupted ``.<name>.partial`` folder or a finished one.

        A finished run is copied to its partial folder first, with hard links where the file system
        allows (files are replaced, never written in place), so it stays intact until the resumed run
        finishes and the copy costs no disk. The run's lock is taken first (see :meth:`start`): a run
        whose writer is alive is not resumed.
        """
        lock = lock or cls.lock_for(path)
        with _held(lock):
            given = cls.check_run(path)
            final, partial = cls.paths(given)
            if given == partial:
                return cls(final, partial, lock)
            try:
                if partial.exists():
                    shutil.rmtree(partial)
                shutil.copytree(given, partial, copy_function=_link_or_copy)
            except OSError as err:
                raise RunFolderWriteError(
                    f"cannot copy {given} to {partial} to resume ({err.strerror or err}); check permissions"
                ) from None
        return cls(given, partial, lock)

    def file(self, relative: str) -> Path:
        """Path of a file inside the run (its parent folders are created)."""
        path = self.path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def discard(self) -> None:
        """Delete the partial folder: for a run that failed before it produced anything worth keeping."""
        if self.path != self.final:
            shutil.rmtree(self.path, ignore_errors=True)
        self.release()

    def release(self) -> None:
        """Give up the run's lock (the writer is done, the folder stays as it is)."""
        if self.lock is not None:
            self.lock.release()

    def finish(self) -> Path:
        """Rename the partial folder to its final name, replacing an older run there; return that name."""
        old = self.final.with_name(f".{self.final.name}.old")
        if old.exists():
            shutil.rmtree(old)
        if self.final.exists():
            os.replace(self.final, old)
        os.replace(self.path, self.final)
        if old.exists():
            shutil.rmtree(old)
        self.path = self.final
        self.release()
        return self.final


def _unwritable(final: Path, err: OSError) -> RunFolderWriteError:
    return RunFolderWriteError(
        f"cannot write the run folder {final} ({err.strerror or err}); choose a writable --out"
    )


@contextlib.contextmanager
def _held(lock: FolderLock) -> Iterator[None]:
    """Take ``lock`` for what follows; give it back if that fails, unless the caller held it before."""
    already = lock.held
    StagedFolder.acquire(lock)
    try:
        yield
    except BaseException:
        if not already:
            lock.release()
        raise


def _absolute(path: str | Path) -> Path:
    """``path`` made absolute with ``..`` and ``.`` folded in (symbolic links are left as they are)."""
    return Path(os.path.abspath(Path(path).expanduser()))


def _partial_path(final: Path) -> Path:
    return final.with_name(f".{final.name}{PARTIAL_SUFFIX}")


def _is_empty_dir(folder: Path) -> bool:
    return folder.is_dir() and not any(folder.iterdir())


def _link_or_copy(src: str, dst: str) -> None:
    """Hard-link ``src`` to ``dst`` (no disk used), or copy it where links are not possible."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
