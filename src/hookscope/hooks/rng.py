"""torch's random state (CPU and every initialised CUDA device): captured and put back, in one place.

A replay draws the same dropout masks as the run it repeats only from the same state: the guard's replay
of a bad batch, ``find_nonfinite``'s second pass and a checkpoint (which adds Python's, numpy's and the
DataLoaders' generators, :mod:`hookscope.train.checkpoint.rng`) all capture and restore it here.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class TorchRng(NamedTuple):
    """torch's CPU generator state, and each CUDA device's (None when CUDA was never initialised: a run
    that never touched it has no CUDA stream to keep, and capturing would initialise it)."""

    cpu: torch.Tensor
    cuda: list[torch.Tensor] | None


def torch_rng() -> TorchRng:
    """The state of torch's generators now (host tensors; no device sync)."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    return TorchRng(torch.default_generator.get_state(), cuda)  # what get_rng_state returns, one call less


def restore_torch_rng(state: TorchRng) -> None:
    """Put back what :func:`torch_rng` captured; the CUDA states only where CUDA is available."""
    torch.set_rng_state(state.cpu)
    if state.cuda is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state.cuda)
