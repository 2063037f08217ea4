"""A folder written under a hidden partial name and renamed into place once complete.

Run folders (the :class:`~hookscope.callbacks.RunFolder` callback, ``hookscope train``) and the output
of ``hookscope inspect`` are written this way, so a crash never leaves a folder that looks complete.
Layout of ``runs/<name>/`` after a fit with ``RunFolder`` (or ``hookscope train``)::

    config.json     every option, the command line, library versions, start and end time
    metrics.csv     per-epoch rows and per-step rows at a bounded rate (column ``kind``)
    metrics.jsonl   the same rows, one JSON object per line
    findings.json   the doctor's findings
    summary.txt     the model summary table; summary.json the same rows for the report
    checkpoints/    final.pt and best.pt
    figures/*.png   curves, statistics, gradient flow, feature maps
    report.html     the self-contained report

A run is written into the hidden sibling ``.<name>.partial`` and renamed to ``<name>`` only once every
file is there, so a folder called ``<name>`` is always complete; an interrupted run stays ``.partial`` and
``hookscope train --resume`` (or ``fit(resume=...)`` with the same ``RunFolder``) continues it. Every
single file is written atomically too (``hookscope.atomic``), so a reader never sees half a file.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

CONFIG = "config.json"
PARTIAL_SUFFIX = ".partial"


class RunFolderError(Exception):
    """The run folder given is not usable (exists with other files, not a run); the message says why."""


class RunFolderWriteError(RunFolderError):
    """The file system refused to create or copy the run folder (permissions, a file in the way)."""


def read_json(path: str | Path) -> Any:
    """Read a JSON file, with a one-line error naming the file when it is missing or malformed."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RunFolderError(f"{path} does not exist; is {path.parent} a hookscope run folder?") from None
    except json.JSONDecodeError as err:
        raise RunFolderError(f"{path} is not valid JSON ({err}); rerun the command that wrote it") from None


class StagedFolder:
    """Where one run writes its files: ``path`` is the hidden partial folder until :meth:`finish`."""

    def __init__(self, final: Path, path: Path) -> None:
        self.final = final
        self.path = path

    @staticmethod
    def paths(out: str | Path) -> tuple[Path, Path]:
        """``(final, partial)`` for ``out``, which may name either of them."""
        given = Path(out).expanduser().absolute()
        if given.name.startswith(".") and given.name.endswith(PARTIAL_SUFFIX):
            return given.with_name(given.name[1 : -len(PARTIAL_SUFFIX)]), given
        return given, _partial_path(given)

    @staticmethod
    def check(out: str | Path) -> None:
        """Refuse ``out`` when it exists and holds anything but a hookscope run: it would be replaced."""
        final = Path(out).expanduser().absolute()
        if final.exists() and not _is_replaceable(final):
            raise RunFolderError(
                f"--out {final} already exists and is not a hookscope run folder (no {CONFIG}); "
                "choose another --out or remove it"
            )

    @staticmethod
    def check_run(run_dir: str | Path) -> Path:
        """``run_dir`` as an absolute path, when it holds a run to continue; else a one-line refusal."""
        given = Path(run_dir).expanduser().absolute()
        if not (given / CONFIG).is_file():
            raise RunFolderError(
                f"--resume {given} is not a hookscope run folder (no {CONFIG}); "
                "give the folder that `hookscope train` wrote"
            )
        return given

    @classmethod
    def start(cls, out: str | Path) -> StagedFolder:
        """Begin a fresh run that will end up at ``out``; a stale partial folder of ``out`` is discarded.

        ``out`` may already hold an older complete run (it is replaced at :meth:`finish`), but not
        unrelated files: that would be destroyed, so it is refused.
        """
        final = Path(out).expanduser().absolute()
        cls.check(final)
        partial = _partial_path(final)
        try:
            if partial.exists():
                shutil.rmtree(partial)
            partial.mkdir(parents=True)
            _check_writable(partial)
        except OSError as err:
            raise RunFolderWriteError(
                f"cannot write the run folder {final} ({err.strerror or err}); choose a writable --out"
            ) from None
        return cls(final, partial)

    @classmethod
    def resume(cls, run_dir: str | Path) -> StagedFolder:
        """Continue the run in ``run_dir``: an interrupted ``.<name>.partial`` folder or a finished one.

        A finished run is copied to its partial folder first, so it stays intact until the resumed
        run finishes.
        """
        given = cls.check_run(run_dir)
        final, partial = cls.paths(given)
        if given == partial:
            return cls(final, partial)
        try:
            if partial.exists():
                shutil.rmtree(partial)
            shutil.copytree(given, partial)
        except OSError as err:
            raise RunFolderWriteError(
                f"cannot copy {given} to {partial} to resume ({err.strerror or err}); check permissions"
            ) from None
        return cls(given, partial)

    def file(self, relative: str) -> Path:
        """Path of a file inside the run (its parent folders are created)."""
        path = self.path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def discard(self) -> None:
        """Delete the partial folder: for a run that failed before it produced anything worth keeping."""
        if self.path != self.final:
            shutil.rmtree(self.path, ignore_errors=True)

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
        return self.final


def _partial_path(final: Path) -> Path:
    return final.with_name(f".{final.name}{PARTIAL_SUFFIX}")


def _is_replaceable(final: Path) -> bool:
    """An empty folder or an earlier run folder may be replaced; anything else is the user's."""
    if not final.is_dir():
        return False
    return (final / CONFIG).is_file() or not any(final.iterdir())


def _check_writable(folder: Path) -> None:
    """mkdir can succeed where writing files fails (read-only bind mounts); find out now, not at the end."""
    probe = folder / ".write-probe"
    probe.write_bytes(b"")
    probe.unlink()
