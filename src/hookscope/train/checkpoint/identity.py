"""Whose checkpoint is it: the identity of the run that wrote it, so a resume continues its own run only.

Runs side by side (a sweep, a shell loop) easily point at one checkpoint folder or pass each other's
``last.pt``; a resume from another run's checkpoint would silently continue *that* run with this one's
name. Each checkpoint records its run's identity — the model's structure, the data's sizes (and a cheap
hash of in-memory tensors), the loss, optimizer and learning rate — and ``fit(resume=...)`` refuses one
whose identity differs, saying what differs, unless the Checkpoint callback says
``allow_other_run=True`` (``hookscope train --allow-other-run``). Starting from another run's weights
is not a resume: ``learn.load(path)`` or ``hookscope train --weights``.

The identity is cheap: no batch is drawn and no RNG is touched (a random transform would change it and
the resume would not be exact).
"""

from __future__ import annotations

import hashlib
import re
import warnings
import zlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from hookscope.train.checkpoint.file import CheckpointError
from hookscope.train.checkpoint.weights import unwrap

if TYPE_CHECKING:
    from hookscope.train.learner import Learner

_HASHED_BYTES = 1 << 16  # of each in-memory data tensor, from its start and from its end
_warned_without_identity = False


def run_identity(learn: Learner) -> dict[str, Any]:
    """The identity of ``learn``'s run: ``model`` (structure), ``data`` (per loader) and ``config``."""
    return {
        "model": model_fingerprint(unwrap(learn.model)),
        "data": {role: loader_fingerprint(getattr(learn.dls, role)) for role in ("train", "valid")},
        "config": {
            "loss_func": _name(learn.loss_func),
            "opt_func": _name(learn.opt_func),
            "lr": float(learn.lr),
        },
    }


def model_fingerprint(model: nn.Module) -> str:
    """The model's class and every module's name and class, hashed: its structure, not its weights nor
    its parameter shapes (pruning may compact them during a run; the weights check catches a misfit)."""
    lines = [
        f"{name}:{_class_name(module)}"
        for name, module in model.named_modules()
        if "parametrizations" not in name.split(".")
    ]
    digest = hashlib.sha1("\n".join(lines).encode()).hexdigest()[:12]
    return f"{_class_name(model)}-{digest}"


def _class_name(module: nn.Module) -> str:
    """The user's class: parametrization (``ParametrizedLinear(Linear)``) and FSDP2 (``fully_shard``
    makes ``FSDPLinear(FSDPModule, Linear)``) swap a module's class for a subclass of it, whose last base
    is the user's; a checkpoint of 2 sharded ranks resumes in one plain process."""
    cls = type(module)
    if cls.__name__.startswith(("Parametrized", "FSDP")) and cls.__bases__:
        return cls.__bases__[-1].__name__
    return cls.__name__


def loader_fingerprint(loader: Any) -> dict[str, Any] | None:
    """Sizes of a loader's data (samples, batch size) and, for in-memory tensors, a CRC of their first
    and last bytes; None when there is no loader. Not the number of batches: under torchrun it depends
    on the number of processes, and a resume by another number is allowed (with a warning)."""
    if loader is None:
        return None
    dataset = getattr(loader, "dataset", None)
    found: dict[str, Any] = {
        "samples": _length(dataset),
        "batch_size": getattr(loader, "batch_size", None),
    }
    tensors = getattr(dataset, "tensors", None)
    if isinstance(tensors, tuple) and all(isinstance(t, torch.Tensor) for t in tensors):
        found["crc"] = _tensors_crc(tensors)
    return found


def check_identity(saved: Mapping[str, Any] | None, learn: Learner, source: str, allowed: bool) -> None:
    """Refuse, naming what differs, to resume ``learn`` from a checkpoint of another run (``allowed``:
    the user asked for it). A checkpoint written before identities were recorded resumes, with one
    warning per process."""
    if saved is None:
        _warn_without_identity(source)
        return
    differences = describe_differences(saved, run_identity(learn))
    if not differences or allowed:
        return
    raise CheckpointError(
        f"{source} is a checkpoint of another run ({'; '.join(differences)}); resuming would continue "
        "that run under this one's name. Resume this run's own checkpoint, or pass "
        "Checkpoint(..., allow_other_run=True) (hookscope train: --allow-other-run) to continue it anyway; "
        "to start from its weights, load them instead (learn.load(path), hookscope train --weights)"
    )


def describe_differences(saved: Mapping[str, Any], here: Mapping[str, Any]) -> list[str]:
    """``["data train: 1437 samples there, 1000 here", ...]``: every field that differs."""
    differences = []
    if saved.get("model") != here["model"]:
        differences.append(f"model: {saved.get('model')} there, {here['model']} here")
    for role in ("train", "valid"):
        theirs, ours = (saved.get("data") or {}).get(role), here["data"][role]
        for key in sorted(set(theirs or {}) | set(ours or {})):
            a, b = (theirs or {}).get(key), (ours or {}).get(key)
            if a != b:
                differences.append(f"{role} data {key}: {a} there, {b} here")
    for key, value in here["config"].items():
        theirs = (saved.get("config") or {}).get(key)
        if theirs != value:
            differences.append(f"{key}: {theirs} there, {value} here")
    return differences


def _tensors_crc(tensors: tuple[torch.Tensor, ...]) -> int:
    crc = 0
    for tensor in tensors:
        flat = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
        crc = zlib.crc32(f"{tensor.dtype}{tuple(tensor.shape)}".encode(), crc)
        head, tail = flat[:_HASHED_BYTES], flat[-_HASHED_BYTES:]
        crc = zlib.crc32(tail.numpy(), zlib.crc32(head.numpy(), crc)) if flat.numel() else crc
    return crc


def _length(obj: Any) -> int | None:
    try:
        return len(obj)
    except TypeError:  # an iterable dataset has no length
        return None


def _name(obj: Any) -> str:
    name = getattr(obj, "__name__", None) or type(obj).__name__
    return re.sub(r" at 0x[0-9a-f]+", "", name)


def _warn_without_identity(source: str) -> None:
    global _warned_without_identity
    if _warned_without_identity:
        return
    _warned_without_identity = True
    warnings.warn(
        f"{source} records no run identity (written before hookscope kept one), so whether it belongs to "
        "this run cannot be checked; it resumes as before (this warning is shown once)",
        stacklevel=4,
    )
