"""Exporting a model's weights as safetensors: a tensors-only file to share, deploy or compare bitwise.

Unlike a checkpoint it holds no optimizer, callback or RNG state, and any safetensors reader loads it.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from hookscope.atomic import atomic_write_bytes
from hookscope.train import distributed
from hookscope.train.checkpoint.sharded import full_state_dict
from hookscope.train.checkpoint.weights import unwrap


def export_safetensors(model: nn.Module, path: str | os.PathLike[str]) -> Path:
    """Write the model's weights (its ``state_dict``) as a safetensors file, atomically.

    safetensors holds tensors only, so the file is safe to share and loads without pickle:
    ``model.load_state_dict(safetensors.torch.load_file(path))``. Tied weights are stored under each name.
    A model sharded with FSDP2 is gathered whole onto rank 0's CPU, which writes: every rank calls this.
    """
    from safetensors.torch import save as safetensors_bytes

    sharded = distributed.is_sharded(model)
    state = full_state_dict(model) if sharded else unwrap(model).state_dict()
    if sharded and not distributed.is_rank_zero():
        return Path(path)
    tensors: dict[str, torch.Tensor] = {}
    storages: set[int] = set()
    for name, tensor in state.items():
        tensor = tensor.detach().cpu().contiguous()
        storage = tensor.untyped_storage().data_ptr()
        # safetensors refuses tensors sharing memory (tied weights, views of one buffer): copy the later ones
        tensors[name] = tensor.clone() if storage in storages else tensor
        storages.add(storage)
    data = safetensors_bytes(tensors, metadata={"format": "pt", "written_by": "hookscope"})
    return atomic_write_bytes(path, data)
