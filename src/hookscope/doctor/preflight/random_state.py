"""What preflight leaves as it found it: torch's (CPU and initialised CUDA), numpy's and Python's random
generators, and the ones a DataLoader draws its order from, restored after the checks."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


@contextmanager
def random_state_kept(loader: Any) -> Iterator[None]:
    """Restore torch's (CPU and initialised CUDA), numpy's and Python's generators, and the loader's own."""
    import numpy as np

    python_state, numpy_state = random.getstate(), np.random.get_state()
    generators = [(g, g.get_state()) for g in _loader_generators(loader)]
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)
        for g, state in generators:
            g.set_state(state)


def _loader_generators(loader: Any) -> list[torch.Generator]:
    """The generators a DataLoader draws its order from (its own, its sampler's), each once."""
    found: dict[int, torch.Generator] = {}
    for owner in (
        loader,
        getattr(loader, "sampler", None),
        getattr(getattr(loader, "batch_sampler", None), "sampler", None),
    ):
        g = getattr(owner, "generator", None)
        if isinstance(g, torch.Generator):
            found[id(g)] = g
    return list(found.values())
