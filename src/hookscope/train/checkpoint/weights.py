"""A model's weights in a checkpoint: the user's model inside a DDP wrapper, and whether a state fits it.

Checkpoints store the unwrapped model's ``state_dict`` so a file saved under DistributedDataParallel loads
into the plain model and back. A state that does not fit is refused in one line naming the first
mismatching keys, before anything is changed. A pruned model's checkpoint (``weight_orig`` and
``weight_mask`` where the model has ``weight``) fits a fresh copy of the model: its masks are put back.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from hookscope.pruning.masks import masks_to_restore, restore_masks
from hookscope.train.checkpoint.file import CheckpointError

_SHOWN = 3  # how many mismatching keys an error message names


def unwrap(model: nn.Module) -> nn.Module:
    """The user's model inside a ``DistributedDataParallel`` / ``DataParallel`` wrapper (or the model)."""
    wrappers = (nn.parallel.DistributedDataParallel, nn.DataParallel)
    return model.module if isinstance(model, wrappers) else model


def check_model_state(model: nn.Module, state: Mapping[str, torch.Tensor], source: str) -> None:
    """Raise one line naming ``source`` (the file) and the first missing, unexpected and mis-shaped keys
    when ``state`` does not fit ``model``.

    When ``state`` holds pruned tensors that ``model`` holds unpruned, and fits otherwise, the pruning masks
    are put on ``model`` (``weight_orig`` stays the same parameter object, so an optimizer keeps it) for
    ``load_state_dict`` to fill; a refused state changes nothing.
    """
    pruned = masks_to_restore(model, state)
    own = _with_masks(model.state_dict(), pruned)
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
            f"{_fix(missing)}"
        )
    restore_masks(model, pruned)


def _with_masks(own: Mapping[str, torch.Tensor], pruned: list[str]) -> dict[str, torch.Tensor]:
    """``own`` as it will be once ``pruned`` tensors carry masks: ``<name>_orig`` and ``<name>_mask``."""
    keys = dict(own)
    for name in pruned:
        tensor = keys.pop(name)
        keys[f"{name}_orig"] = keys[f"{name}_mask"] = tensor
    return keys


def _fix(missing: list[str]) -> str:
    if any(key.endswith(("_orig", "_mask")) for key in missing):
        return (
            "this model is pruned and the file is not; load it before pruning, or make the file's model "
            "pruned alike (hs.prune) before saving"
        )
    return "build the same architecture before loading"


def _head(items: list[str]) -> str:
    more = f" (+{len(items) - _SHOWN} more)" if len(items) > _SHOWN else ""
    return ", ".join(items[:_SHOWN]) + more
