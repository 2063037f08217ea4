"""Atomic file writes: the one way hookscope puts a file on disk.

A reader — or the next run after a crash — sees either the previous file or the whole new one, never a
part: the bytes go to a temp file in the same folder, are flushed and fsynced, then renamed over the
target, and the folder is fsynced so the rename itself survives a power cut. Checkpoints, metrics,
figures, the report and every run-folder file go through here.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

FILE_MODE = 0o644  # mkstemp creates 0600; run folders and checkpoints are meant to be shared and served


def atomic_write(path: str | os.PathLike[str], write: Callable[[IO[bytes]], None]) -> Path:
    """Write ``path`` through ``write(file)`` (e.g. ``torch.save``) atomically; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically."""
    return atomic_write(path, lambda file: file.write(data))


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write UTF-8 text atomically."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> Path:
    """Write ``obj`` as indented JSON atomically; non-JSON values (paths, dtypes) are written as strings."""
    return atomic_write_text(path, json.dumps(obj, indent=2, default=str) + "\n")


def fsync_dir(folder: Path) -> None:
    """fsync a folder so a rename in it is durable (not possible on Windows, where rename is durable)."""
    if os.name == "nt":
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
