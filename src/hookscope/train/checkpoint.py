"""Checkpoints: the full training state in one file that loads safely, writes atomically, resumes exactly.

A checkpoint is a dict of plain containers, tensors, numbers and strings — never a pickled object — so it
loads with ``torch.load(weights_only=True)`` and loading it can run no code. Every random number generator
is stored as tensors and plain values. The file carries a CRC32 of its content, because a flipped byte in a
tensor would otherwise load silently. Files are replaced atomically (temp file in the same folder, fsync,
``os.replace``, fsync of the folder), so a crash during a save leaves the previous checkpoint intact.

Exact mid-epoch resume needs two RNG snapshots: the one taken at the start of the epoch's training phase
(replaying it reproduces the sampler's shuffle, so the same remaining batches come in the same order) and
the one at the moment of the save (so dropout and augmentations continue the same stream).
"""

from __future__ import annotations

import os
import pickle
import random
import warnings
import zipfile
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from hookscope.atomic import atomic_write, atomic_write_bytes, fsync_dir

if TYPE_CHECKING:
    from hookscope.train.learner import Learner

FORMAT = "hookscope.checkpoint"
VERSION = 1

_PLAIN_LEAVES = (bool, int, float, str, bytes, type(None), torch.dtype, torch.device)
_SHOWN = 3  # how many mismatching keys an error message names


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written, read or applied; the message names the file and the fix."""


# ---------------------------------------------------------------------------------------------------------
# Random number generators


def capture_rng(generators: Mapping[str, torch.Generator] | None = None) -> dict[str, Any]:
    """Every RNG state as tensors and plain values: python ``random``, numpy, torch CPU, CUDA (when in
    use) and the named ``generators`` (a DataLoader's, a sampler's)."""
    version, mt_state, gauss_next = random.getstate()
    kind, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    state: dict[str, Any] = {
        "python": {"version": version, "state": torch.tensor(mt_state), "gauss_next": gauss_next},
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "torch": torch.get_rng_state(),
        "generators": {name: gen.get_state() for name, gen in (generators or {}).items()},
    }
    if torch.cuda.is_initialized():  # a run that never touched CUDA has no CUDA stream to keep
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: Mapping[str, Any], generators: Mapping[str, torch.Generator] | None = None) -> None:
    """Put back every RNG :func:`capture_rng` saw; the named generators must be the same set as saved."""
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"].tolist()), py["gauss_next"]))
    npy = state["numpy"]
    keys = npy["keys"].numpy().astype(np.uint32)
    np.random.set_state((npy["kind"], keys, npy["pos"], npy["has_gauss"], npy["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    generators = generators or {}
    if set(state["generators"]) != set(generators):
        raise CheckpointError(
            f"the checkpoint holds random generators {sorted(state['generators'])} but the data now has "
            f"{sorted(generators)}; build the DataLoaders as the saved run did (same generator= arguments)"
        )
    for name, gen_state in state["generators"].items():
        generators[name].set_state(gen_state)


def loader_generators(dl: object) -> dict[str, torch.Generator]:
    """The ``torch.Generator``s that decide a DataLoader's order: its own and its sampler's (deduplicated)."""
    found: dict[str, torch.Generator] = {}
    candidates = {
        "loader": getattr(dl, "generator", None),
        "sampler": getattr(getattr(dl, "sampler", None), "generator", None),
    }
    for name, gen in candidates.items():
        if isinstance(gen, torch.Generator) and all(gen is not g for g in found.values()):
            found[name] = gen
    return found


# ---------------------------------------------------------------------------------------------------------
# Files: atomic write, safe read


def link_atomic(target: Path, link: Path) -> None:
    """Make ``link`` the same file as ``target`` (a hard link, or a copy where links are unsupported),
    replacing an existing ``link`` atomically."""
    tmp = link.with_name(f".{link.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(target, tmp)
    except OSError:
        atomic_write(tmp, lambda file: file.write(target.read_bytes()))
    os.replace(tmp, link)
    fsync_dir(link.parent)


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


# ---------------------------------------------------------------------------------------------------------
# Model weights


def check_model_state(model: nn.Module, state: Mapping[str, torch.Tensor], source: str) -> None:
    """Raise one line naming ``source`` (the file) and the first missing, unexpected and mis-shaped keys
    when ``state`` does not fit ``model``."""
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [
        f"{k} {tuple(state[k].shape)} in file vs {tuple(own[k].shape)} in model"
        for k in own
        if k in state and state[k].shape != own[k].shape
    ]
    problems = [
        f"{label} {_head(items)}"
        for label, items in (
            ("missing keys", missing),
            ("unexpected keys", unexpected),
            ("shape mismatch", shapes),
        )
        if items
    ]
    if problems:
        raise CheckpointError(
            f"{source} was saved from another model ({type(model).__name__} here): {'; '.join(problems)}; "
            "build the same architecture before loading"
        )


def export_safetensors(model: nn.Module, path: str | os.PathLike[str]) -> Path:
    """Write the model's weights (its ``state_dict``) as a safetensors file, atomically.

    safetensors holds tensors only, so the file is safe to share and loads without pickle:
    ``model.load_state_dict(safetensors.torch.load_file(path))``. Tied weights are stored under each name.
    """
    from safetensors.torch import save as safetensors_bytes

    tensors: dict[str, torch.Tensor] = {}
    storages: set[int] = set()
    for name, tensor in unwrap(model).state_dict().items():
        tensor = tensor.detach().cpu().contiguous()
        storage = tensor.untyped_storage().data_ptr()
        # safetensors refuses tensors sharing memory (tied weights, views of one buffer): copy the later ones
        tensors[name] = tensor.clone() if storage in storages else tensor
        storages.add(storage)
    data = safetensors_bytes(tensors, metadata={"format": "pt", "written_by": "hookscope"})
    return atomic_write_bytes(path, data)


def unwrap(model: nn.Module) -> nn.Module:
    """The user's model inside a ``DistributedDataParallel`` / ``DataParallel`` wrapper (or the model)."""
    wrappers = (nn.parallel.DistributedDataParallel, nn.DataParallel)
    return model.module if isinstance(model, wrappers) else model


def _head(items: list[str]) -> str:
    more = f" (+{len(items) - _SHOWN} more)" if len(items) > _SHOWN else ""
    return ", ".join(items[:_SHOWN]) + more


# ---------------------------------------------------------------------------------------------------------
# The Learner's state


@dataclass(frozen=True)
class Position:
    """Where the loop stands: ``iter`` training batches of ``epoch`` are done (0 = at the epoch's start);
    ``train_iter`` training batches in the whole fit, ``training_step`` optimizer steps ever."""

    epoch: int
    iter: int
    train_iter: int
    training_step: int


def current_position(learn: Learner) -> Position:
    """The position after the last completed training batch, from ``learn.train_iter``.

    Mid-batch (inside ``after_batch``) the current batch is not counted yet; the Checkpoint callback
    passes that position itself.
    """
    n_iter = max(len(learn.dls.train), 1)
    epoch, done = divmod(learn.train_iter, n_iter)
    return Position(epoch, done, learn.train_iter, learn.training_step)


def save_learner(learn: Learner, path: str | os.PathLike[str], position: Position | None = None) -> Path:
    """Write the full state of ``learn`` to ``path`` atomically: model, pending gradients (mid
    accumulation), optimizer, every callback's ``state_dict`` (recorder history, schedulers, grad scaler,
    ...), every RNG, and the loop position."""
    position = position or current_position(learn)
    opt = learn.opt
    state = {
        "model": unwrap(learn.model).state_dict(),
        "grads": _grads(learn.model),
        "optimizer": opt.state_dict() if opt is not None else None,
        "optimizer_type": type(opt).__name__ if opt is not None else None,
        "callbacks": _callback_states(learn),
        "position": {
            "epoch": position.epoch,
            "iter": position.iter,
            "train_iter": position.train_iter,
            "training_step": position.training_step,
            "n_epoch": learn.n_epoch,
        },
        "rng": capture_rng(rng_generators(learn)),
        "epoch_rng": learn.epoch_rng if position.iter else None,
    }
    return write_checkpoint(state, path)


def load_learner(learn: Learner, path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load model, optimizer and callback states from ``path`` into ``learn``; returns the checkpoint.

    The next ``fit`` starts at epoch 0 with these weights; ``fit(n, resume=path)`` continues instead.
    """
    state = load_checkpoint(path)
    _check_fits(learn, state, str(path))
    _load_model(learn, state)
    _load_callback_states(learn, state["callbacks"], str(path))
    _load_optimizer(learn, state)
    return state


def rng_generators(learn: Learner) -> dict[str, torch.Generator]:
    """The generators whose state a checkpoint keeps: those of the training and validation DataLoaders."""
    found: dict[str, torch.Generator] = {}
    for role, dl in (("train", learn.dls.train), ("valid", learn.dls.valid)):
        for name, gen in loader_generators(dl).items():
            if all(gen is not g for g in found.values()):
                found[f"{role}.{name}"] = gen
    return found


def _grads(model: nn.Module) -> dict[str, torch.Tensor]:
    """Gradients not yet consumed by a step (mid gradient-accumulation); empty after ``zero_grad``."""
    return {name: p.grad for name, p in unwrap(model).named_parameters() if p.grad is not None}


def _load_grads(model: nn.Module, grads: Mapping[str, torch.Tensor]) -> None:
    for name, param in unwrap(model).named_parameters():
        param.grad = grads[name].to(param.device, param.dtype) if name in grads else None


def _check_fits(learn: Learner, state: Mapping[str, Any], source: str) -> None:
    """Refuse, before anything is changed, a checkpoint whose model or optimizer does not fit ``learn``."""
    check_model_state(unwrap(learn.model), state["model"], source)
    if state["optimizer"] is None:
        return
    if learn.opt is None:
        learn.create_opt()
    saved, own = state["optimizer_type"], type(learn.opt).__name__
    if saved != own:
        raise CheckpointError(
            f"{source} holds {saved} optimizer state but this Learner uses {own}; "
            f"pass opt_func={saved} (or load only the weights with learn.model.load_state_dict)"
        )
    saved_groups = [len(group["params"]) for group in state["optimizer"]["param_groups"]]
    own_groups = [len(group["params"]) for group in learn.opt.param_groups]
    if saved_groups != own_groups:
        raise CheckpointError(
            f"{source}: parameter groups of {saved_groups} parameters in the file vs {own_groups} in this "
            "optimizer; build the optimizer with the same parameter groups as the saved run"
        )


def _load_model(learn: Learner, state: Mapping[str, Any]) -> None:
    unwrap(learn.model).load_state_dict(state["model"])
    _load_grads(learn.model, state["grads"])


def _load_optimizer(learn: Learner, state: Mapping[str, Any]) -> None:
    if state["optimizer"] is not None:
        learn.opt.load_state_dict(state["optimizer"])


def _callback_states(learn: Learner) -> dict[str, Any]:
    states: dict[str, Any] = {}
    for key, cb in _keyed_callbacks(learn):
        state = cb.state_dict()
        check_plain(state, f"{type(cb).__name__}.state_dict()")
        if state:
            states[key] = state
    return states


def _load_callback_states(learn: Learner, states: Mapping[str, Any], source: str) -> None:
    callbacks = dict(_keyed_callbacks(learn))
    absent = [key for key in states if key not in callbacks]
    if absent:
        warnings.warn(
            f"{source} holds state for callbacks {absent} that this Learner does not have; "
            "that state is ignored, so the resumed run can differ from the original",
            stacklevel=4,
        )
    for key, state in states.items():
        if key in callbacks:
            callbacks[key].load_state_dict(state)


def _keyed_callbacks(learn: Learner) -> list[tuple[str, Any]]:
    """Callbacks keyed by ``cb.name``; a repeated name gets ``.1``, ``.2`` ... in ``learn.cbs`` order."""
    keyed: list[tuple[str, Any]] = []
    seen: dict[str, int] = {}
    for cb in learn.cbs:
        count = seen.get(cb.name, 0)
        seen[cb.name] = count + 1
        keyed.append((cb.name if count == 0 else f"{cb.name}.{count}", cb))
    return keyed


# ---------------------------------------------------------------------------------------------------------
# Resuming inside fit


class Resume:
    """One resumed ``fit``: applies a checkpoint at the right moments of the loop.

    - :meth:`start` (before ``before_fit``): model weights, callback states (callbacks that build things
      in ``before_fit`` keep the state pending until then), loop counters.
    - :meth:`after_before_fit`: the optimizer (after schedulers were built, so the saved learning rates
      win) and, for a checkpoint taken between epochs, the RNGs. Returns the epoch to start at.
    - :func:`train_batches`: for a mid-epoch checkpoint, the saved epoch's shuffle with the batches
      already done skipped, then the RNGs as they were at the save.
    """

    def __init__(self, state: Mapping[str, Any], source: str) -> None:
        self.state = state
        self.source = source
        pos = state["position"]
        self.position = Position(pos["epoch"], pos["iter"], pos["train_iter"], pos["training_step"])
        self.mid_epoch_pending = self.position.iter > 0

    @classmethod
    def start(cls, learn: Learner, resume: str | os.PathLike[str]) -> Resume:
        """Read the checkpoint (``"last"``: ``last.pt`` of ``learn.checkpoint``'s folder; a file; or a
        folder holding ``last.pt``) and apply what must precede ``before_fit``."""
        file = find_latest(_resume_path(learn, resume))
        self = cls(load_checkpoint(file), str(file))
        saved_n_epoch = self.state["position"]["n_epoch"]
        if saved_n_epoch != learn.n_epoch:
            warnings.warn(
                f"{file} was saved during fit({saved_n_epoch}) and is resumed with fit({learn.n_epoch}); "
                "schedules that span the fit (one-cycle, cosine) change, so the run will differ",
                stacklevel=3,
            )
        if self.position.epoch > 0 and getattr(learn.dls.train, "persistent_workers", False):
            warnings.warn(
                f"resuming {file} at epoch {self.position.epoch} with persistent_workers=True: the new "
                "worker processes start fresh random streams, so random transforms inside workers differ "
                "from the original run; use persistent_workers=False for an exact resume",
                stacklevel=3,
            )
        _check_fits(learn, self.state, self.source)
        _load_model(learn, self.state)
        _load_callback_states(learn, self.state["callbacks"], self.source)
        learn.train_iter = self.position.train_iter
        learn.training_step = self.position.training_step
        return self

    def after_before_fit(self, learn: Learner) -> int:
        """Load the optimizer (and, between epochs, the RNGs); return the epoch to start at."""
        _load_optimizer(learn, self.state)
        if not self.mid_epoch_pending:
            restore_rng(self.state["rng"], rng_generators(learn))
        return self.position.epoch


def train_batches(
    learn: Learner, resume: Resume | None, batches_of: Callable[[Any], Iterable[Any]]
) -> tuple[int, Iterator[Any]]:
    """``(index of the first batch, iterator)`` for this epoch's training phase over ``learn.dl``.

    Records the RNGs at the epoch's start (``learn.epoch_rng``) before ``iter(batches_of(learn.dl))``
    draws the shuffle, so a mid-epoch checkpoint can replay it. On a mid-epoch resume: restore that
    epoch-start state, make the iterator, skip the batches already done (fetched, not computed — so
    workers and random transforms advance exactly as in the original run), then restore the RNGs of the
    moment of the save.
    """
    generators = rng_generators(learn)
    if resume is None or not resume.mid_epoch_pending:
        learn.epoch_rng = capture_rng(generators)
        return 0, iter(batches_of(learn.dl))
    resume.mid_epoch_pending = False
    learn.epoch_rng = resume.state["epoch_rng"]
    restore_rng(learn.epoch_rng, generators)
    iterator = iter(batches_of(learn.dl))
    done = resume.position.iter
    for fetched in range(done):
        if next(iterator, None) is None:
            raise CheckpointError(
                f"{resume.source} was saved after batch {done} of epoch {resume.position.epoch}, but the "
                f"epoch now has {fetched} batches; resume with the same training data"
            )
    restore_rng(resume.state["rng"], generators)
    return done, iterator


def find_latest(path: str | os.PathLike[str]) -> Path:
    """A checkpoint file: ``path`` itself, or ``last.pt`` in the folder ``path`` or its ``checkpoints/``."""
    path = Path(path)
    if not path.is_dir():
        return path
    for candidate in (path / "last.pt", path / "checkpoints" / "last.pt"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"no last.pt in {path} or {path / 'checkpoints'}; pass the checkpoint file itself"
    )


def _resume_path(learn: Learner, resume: str | os.PathLike[str]) -> Path:
    if resume != "last":
        return Path(resume)
    folder = getattr(getattr(learn, "checkpoint", None), "dir", None)
    if folder is None:
        raise ValueError(
            "fit(resume='last') reads last.pt from the Checkpoint callback's folder, but this Learner has "
            "no Checkpoint callback; add cbs=[hs.callbacks.Checkpoint(dir)] or pass resume=PATH"
        )
    return Path(folder) / "last.pt"
