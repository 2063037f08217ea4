"""Every random number generator a run draws from, captured as tensors and plain values and put back.

Python ``random``, numpy, torch CPU and CUDA (when in use: :mod:`hookscope.hooks.rng`, the package's one
capture of torch's state) and the ``torch.Generator``s that decide the DataLoaders' order. Plain values
keep the checkpoint loadable with ``weights_only=True``; restoring all of them is what makes a resumed
run draw the same dropout masks, augmentations and shuffles as the original.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from hookscope.hooks.rng import TorchRng, restore_torch_rng, torch_rng
from hookscope.train import distributed
from hookscope.train.checkpoint.file import CheckpointError

if TYPE_CHECKING:
    from hookscope.train.learner import Learner


def capture_rng(generators: Mapping[str, torch.Generator] | None = None) -> dict[str, Any]:
    """Every RNG state as tensors and plain values: python ``random``, numpy, torch CPU, CUDA (when in
    use) and the named ``generators`` (a DataLoader's, a sampler's)."""
    version, mt_state, gauss_next = random.getstate()
    torch_state = torch_rng()
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
        "torch": torch_state.cpu,
        "generators": {name: gen.get_state() for name, gen in (generators or {}).items()},
    }
    if torch_state.cuda is not None:
        state["cuda"] = torch_state.cuda
    return state


def restore_rng(state: Mapping[str, Any], generators: Mapping[str, torch.Generator] | None = None) -> None:
    """Put back every RNG :func:`capture_rng` saw; the named generators must be the same set as saved."""
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"].tolist()), py["gauss_next"]))
    npy = state["numpy"]
    keys = npy["keys"].numpy().astype(np.uint32)
    np.random.set_state((npy["kind"], keys, npy["pos"], npy["has_gauss"], npy["cached_gaussian"]))
    restore_torch_rng(TorchRng(state["torch"], state.get("cuda")))
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


def rank_states(learn: Learner, mid_epoch: bool) -> dict[str, Any]:
    """Under torchrun, ``{"ranks": [...]}``: every rank's RNGs (and, saved ``mid_epoch``, those of the
    epoch's start) and the training sampler's seed, gathered in rank order so that each rank resumes its
    own streams; nothing (``{}``) in one process, where ``rng`` and ``epoch_rng`` say it all."""
    if not distributed.is_distributed():
        return {}
    own = {
        "rng": capture_rng(rng_generators(learn)),
        "epoch_rng": learn.epoch_rng if mid_epoch else None,
        "sampler_seed": learn.distributed.seed,
    }
    return {"ranks": distributed.all_gather(own)}


def rng_generators(learn: Learner) -> dict[str, torch.Generator]:
    """The generators whose state a checkpoint keeps: those of the training and validation DataLoaders."""
    found: dict[str, torch.Generator] = {}
    for role, dl in (("train", learn.dls.train), ("valid", learn.dls.valid)):
        for name, gen in loader_generators(dl).items():
            if all(gen is not g for g in found.values()):
                found[f"{role}.{name}"] = gen
    return found
