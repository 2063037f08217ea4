"""Sharded checkpoints: every rank writes its own shards with ``torch.distributed.checkpoint`` (DCP).

A model sharded with FSDP2 is never whole on one rank, so its checkpoint is not one file: the tensors of
the model and the optimizer go into a DCP folder ``ckpt-<step>.dcp`` beside the learner file
``ckpt-<step>.pt``, each rank writing the shards it holds (no rank gathers the model). The learner file
is the usual hookscope checkpoint — callbacks (the doctor's histories, schedulers...), the RNGs of every
rank, the sampler seed, the loop position — with the optimizer's hyper-parameters, and names the folder
under ``"sharded"``. DCP reshards on load: a checkpoint written by 2 ranks loads on 1 (into the plain
model) or on 4, and a one-process checkpoint written in this format (``Checkpoint(sharded=True)``) loads
into a sharded model.

Loading stays as safe as a one-file checkpoint: tensors are read with ``torch.load(weights_only=True)``
(DCP's own reader), the DCP metadata file is unpickled with an allowlist of DCP's metadata classes
(:class:`SafeReader`: a tampered file cannot run code), a checkpoint holding any non-tensor DCP item is
refused, and everything that is not a tensor lives in the learner file, loaded weights-only as always.
"""

from __future__ import annotations

import contextlib
import pickle
import shutil
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from hookscope.train import distributed
from hookscope.train.checkpoint.file import CheckpointError, load_checkpoint

if TYPE_CHECKING:
    from hookscope.train.learner import Learner

SUFFIX = ".dcp"

# The globals DCP's metadata file may name (checked on torch 2.14.1): its metadata dataclasses, the
# storage entries of its file system writer, torch sizes, dtypes and layouts, and the checkpoint's path.
# BytesStorageMetadata (a pickled object in the data files) is deliberately absent.
_METADATA_GLOBALS = {
    ("torch.distributed.checkpoint.metadata", name)
    for name in (
        "Metadata",
        "MetadataIndex",
        "StorageMeta",
        "TensorProperties",
        "TensorStorageMetadata",
        "ChunkStorageMetadata",
        "_MEM_FORMAT_ENCODING",
    )
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"),
    ("torch", "Size"),
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
    ("collections", "OrderedDict"),
}


def tensors_folder(path: Path) -> Path:
    """The DCP folder beside the learner file ``path`` (``ckpt-00000040.pt`` -> ``ckpt-00000040.dcp``)."""
    return path.with_suffix(SUFFIX)


def remove_unreferenced(folder: Path) -> None:
    """Delete the DCP folders in ``folder`` that no learner file there names any more (the numbered file
    was rotated away and ``best.pt`` points elsewhere): each holds a whole model's shards."""
    orphans = [t for t in folder.glob(f"ckpt-*{SUFFIX}") if not t.with_suffix(".pt").is_file()]
    best = folder / "best.pt"
    kept = load_checkpoint(best).get("sharded") if orphans and best.is_file() else None
    for tensors in orphans:
        if tensors.name != kept:
            shutil.rmtree(tensors, ignore_errors=True)


def save_tensors(model: nn.Module, opt: torch.optim.Optimizer | None, path: Path) -> dict[str, Any]:
    """Write the tensors of ``model`` and ``opt`` (each rank its shards) into the DCP folder beside ``path``;
    returns what the learner file keeps instead: the folder's name and the optimizer's plain values.

    Under torchrun every rank calls it together (DCP's save is collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    tensors: dict[str, Any] = {"model": get_model_state_dict(model)}
    plain = None
    if opt is not None:
        tensors["optimizer"], plain = _split(get_optimizer_state_dict(model, opt))
    with _one_process_quietly():
        # the same step saved twice (every n steps and at the epoch's end) overwrites its own folder
        writer = dcp.FileSystemWriter(tensors_folder(path), overwrite=True)
        dcp.save(tensors, storage_writer=writer, no_dist=not distributed.is_distributed())
    return {"sharded": tensors_folder(path).name, "optimizer_plain": plain}


def load_model(model: nn.Module, state: Mapping[str, Any], source: str) -> None:
    """Read this rank's part of the model from the DCP folder the learner file ``source`` names."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    target = {"model": get_model_state_dict(model)}
    _load(target, state, source)
    set_model_state_dict(model, target["model"])


def load_optimizer(
    model: nn.Module, opt: torch.optim.Optimizer, state: Mapping[str, Any], source: str
) -> None:
    """Read this rank's part of the optimizer state, and its hyper-parameters from the learner file."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    if state["optimizer_plain"] is None:
        return
    # a fresh optimizer has no state to load into: torch builds it with a step at learning rate 0
    tensors, _ = _split(get_optimizer_state_dict(model, opt))
    target = {"optimizer": tensors}
    _load(target, state, source)
    set_optimizer_state_dict(model, opt, _merge(target["optimizer"], state["optimizer_plain"]))


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole ``state_dict`` of a sharded model on rank 0, on the CPU (empty on other ranks): every
    rank must call it (the shards are gathered), for ``export`` — one plain file for inference."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _METADATA_GLOBALS or (module == "torch" and _is_dtype(name)):
            return super().find_class(module, name)
        raise CheckpointError(
            f"refused to load — the DCP metadata names {module}.{name}, which hookscope's sharded "
            "checkpoints never hold (a pickled object: the folder was not written by hookscope or was "
            "tampered with)"
        )


def _is_dtype(name: str) -> bool:
    return isinstance(getattr(torch, name, None), torch.dtype)


def safe_reader(folder: Path) -> Any:
    """DCP's file system reader with its metadata read through an allowlist (see the module)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta, TensorStorageMetadata

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            path = Path(self.path) / ".metadata"
            with open(path, "rb") as file:
                metadata = _MetadataUnpickler(file).load()
            items = getattr(metadata, "state_dict_metadata", {})
            if not all(isinstance(item, TensorStorageMetadata) for item in items.values()):
                raise CheckpointError(
                    f"{folder}: refused to load — a DCP item is not a tensor (a pickled object)"
                )
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader(folder)


def _load(target: dict[str, Any], state: Mapping[str, Any], source: str) -> None:
    import torch.distributed.checkpoint as dcp

    folder = Path(source).parent / state["sharded"]
    if not (folder / ".metadata").is_file():
        raise CheckpointError(
            f"{source} names the sharded tensors {folder}, which are missing or incomplete; resume from an "
            "older checkpoint (keep the .dcp folder beside its .pt file when you copy checkpoints)"
        )
    reader = safe_reader(folder)
    try:
        reader.read_metadata()  # refused here, in one line, before DCP reads anything
    except CheckpointError as exc:
        raise CheckpointError(f"{folder}: {exc}") from None
    try:
        with _one_process_quietly():
            dcp.load(target, storage_reader=reader, no_dist=not distributed.is_distributed())
    except Exception as exc:  # DCP wraps every rank's error in one CheckpointException
        first = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(
            f"{folder}: the sharded tensors do not fit this model and optimizer ({first})"
        ) from None


@contextlib.contextmanager
def _one_process_quietly() -> Iterator[None]:
    """DCP warns that it runs in one process whenever there is no process group: that is intended here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _split(optim_state: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """An optimizer ``state_dict`` keyed by parameter names as ``(tensors, plain values)``: the tensors go
    to DCP, the rest (hyper-parameters, non-tensor state) to the learner file."""
    tensors: dict[str, Any] = {}
    plain: dict[str, Any] = {"state": {}, "param_groups": optim_state["param_groups"]}
    for name, values in optim_state["state"].items():
        tensors[name] = {k: v for k, v in values.items() if isinstance(v, torch.Tensor)}
        plain["state"][name] = {k: v for k, v in values.items() if not isinstance(v, torch.Tensor)}
    return tensors, plain


def _merge(tensors: Mapping[str, Any], plain: Mapping[str, Any]) -> dict[str, Any]:
    """The optimizer ``state_dict`` :func:`_split` took apart."""
    state = {name: {**values, **tensors.get(name, {})} for name, values in plain["state"].items()}
    return {"state": state, "param_groups": plain["param_groups"]}


def uses_sharded_format(learn: Learner, requested: bool) -> bool:
    """Whether a checkpoint of ``learn`` goes through DCP: asked for, or the model is sharded (a sharded
    model has no whole ``state_dict`` on any rank)."""
    return requested or distributed.is_sharded(learn.model)
