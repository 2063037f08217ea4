"""The checkpoint file: its format marker and version, its checksum, atomic writes and safe loading.

A checkpoint is a dict of plain containers, tensors, numbers and strings — never a pickled object — so it
loads with ``torch.load(weights_only=True)`` and loading it can run no code. The file carries a CRC32 of
its content, because a flipped byte in a tensor would otherwise load silently. Files are replaced
atomically (temp file in the same folder, fsync, ``os.replace``, fsync of the folder), so a crash during a
save leaves the previous checkpoint intact.
"""

from __future__ import annotations

import os
import pickle
import zipfile
import zlib
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from hookscope.atomic import atomic_write, fsync_dir

FORMAT = "hookscope.checkpoint"
VERSION = 1

_PLAIN_LEAVES = (bool, int, float, str, bytes, type(None), torch.dtype, torch.device)


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written, read or applied; the message names the file and the fix."""


def write_checkpoint(state: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Check that ``state`` holds only weights-only-loadable values, stamp format, version and checksum,
    and write it atomically to ``path``."""
    check_plain(state, "checkpoint")
    payload = {"format": FORMAT, "version": VERSION, **state}
    payload["checksum"] = _checksum(state)
    return atomic_write(path, lambda file: torch.save(payload, file))


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a checkpoint with ``torch.load(weights_only=True)`` onto the CPU and verify it.

    Raises :class:`CheckpointError` with one line naming the file when it carries a pickled object, is
    truncated or corrupt, or is not a hookscope checkpoint.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"no checkpoint at {path}; pass a checkpoint file or a folder holding last.pt"
        )
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        reason = next((line for line in str(exc).splitlines() if "GLOBAL" in line), "a non-plain object")
        raise CheckpointError(
            f"{path}: refused to load — the file carries a pickled Python object ({reason.strip()}); "
            "hookscope checkpoints hold only tensors and plain values, so this file was not written by "
            "hookscope or was tampered with — do not load it with weights_only=False unless you trust it"
        ) from None
    except (RuntimeError, EOFError, KeyError, ValueError, OSError, zipfile.BadZipFile) as exc:
        raise CheckpointError(
            f"{path}: truncated or corrupt checkpoint ({type(exc).__name__}: {_first_line(exc)}); "
            "resume from an older checkpoint (Checkpoint(keep_last=K) keeps several)"
        ) from None
    _verify(payload, path)
    return payload


def link_atomic(target: Path, link: Path) -> None:
    """Make ``link`` the same file as ``target`` (a hard link, or a copy where links are unsupported),
    replacing an existing ``link`` atomically, so ``last.pt`` and ``best.pt`` cost no second write."""
    tmp = link.with_name(f".{link.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(target, tmp)
    except OSError:
        atomic_write(tmp, lambda file: file.write(target.read_bytes()))
    os.replace(tmp, link)
    fsync_dir(link.parent)


def check_plain(obj: object, where: str) -> None:
    """Raise :class:`CheckpointError` naming the first value that ``torch.load(weights_only=True)`` would
    refuse (anything but dicts, lists, tuples, tensors, numbers, strings, None)."""
    if isinstance(obj, torch.Tensor) or type(obj) in _PLAIN_LEAVES:
        return
    if type(obj) in (dict, OrderedDict):
        for key, value in obj.items():
            check_plain(key, f"{where} key")
            check_plain(value, f"{where}[{key!r}]")
        return
    if type(obj) in (list, tuple, torch.Size):
        for i, value in enumerate(obj):
            check_plain(value, f"{where}[{i}]")
        return
    raise CheckpointError(
        f"{where} is a {type(obj).__module__}.{type(obj).__qualname__}, which a weights_only checkpoint "
        "cannot hold; return only tensors, numbers, strings, lists and dicts from state_dict()"
    )


def _verify(payload: object, path: Path) -> None:
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(
            f"{path}: not a hookscope checkpoint (no format marker {FORMAT!r}); for plain model weights "
            "use model.load_state_dict(torch.load(path, weights_only=True))"
        )
    if payload.get("version") != VERSION:
        raise CheckpointError(
            f"{path}: checkpoint format version {payload.get('version')!r}, this hookscope reads "
            f"version {VERSION}; load it with the hookscope version that wrote it"
        )
    state = {k: v for k, v in payload.items() if k not in ("format", "version", "checksum")}
    if payload.get("checksum") != _checksum(state):
        raise CheckpointError(
            f"{path}: corrupt checkpoint (checksum mismatch: the content changed after it was written); "
            "resume from an older checkpoint"
        )


def _checksum(obj: object, crc: int = 0) -> int:
    """CRC32 over every key, leaf value and tensor byte, in a fixed walk order."""
    if isinstance(obj, torch.Tensor):
        tensor = obj.detach().cpu().contiguous()
        crc = zlib.crc32(f"{tensor.dtype}{tuple(tensor.shape)}".encode(), crc)
        return zlib.crc32(tensor.reshape(-1).view(torch.uint8).numpy(), crc) if tensor.numel() else crc
    if isinstance(obj, Mapping):
        for key, value in obj.items():
            crc = _checksum(value, zlib.crc32(repr(key).encode(), crc))
        return crc
    if type(obj) in (list, tuple, torch.Size):
        for value in obj:
            crc = _checksum(value, crc)
        return crc
    return zlib.crc32(repr(obj).encode(), crc)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "no details"
