"""The Learner's data: a train/valid pair of DataLoaders, and batching in-memory tensors without collating.

A ``DataLoader`` over a ``TensorDataset`` indexes one sample at a time and stacks them again (``collate``),
which costs as much as the forward pass of a small model. When the loader is that simple — a
``TensorDataset``, the default collate, no workers, a sequential or random sampler — :class:`TensorBatches`
moves the tensors to the device once and cuts each batch by indexing, giving the same batches in the same
order and drawing the random generators exactly as iterating the ``DataLoader`` would.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    RandomSampler,
    SequentialSampler,
    TensorDataset,
    default_collate,
)

from hookscope.hooks.tensors import map_tensors
from hookscope.train.distributed import DistributedSampler, ShardSampler

# Samplers whose order ``list(sampler)`` gives exactly (each rank's shard under torchrun included).
_INDEXABLE_SAMPLERS = (SequentialSampler, RandomSampler, DistributedSampler, ShardSampler)


@dataclass
class DataLoaders:
    """The training loader and an optional validation loader.

    ``in_memory=False`` turns off the :class:`TensorBatches` fast path (e.g. to time the plain loader).
    """

    train: DataLoader
    valid: DataLoader | None = None
    in_memory: bool = True

    def __post_init__(self) -> None:
        for role, loader in (("train", self.train), ("valid", self.valid)):
            if loader is None and role == "valid":
                continue
            if not hasattr(loader, "__iter__") or not hasattr(loader, "__len__"):
                raise TypeError(
                    f"DataLoaders: {role} must be a DataLoader (iterable with a length), "
                    f"got {type(loader).__name__}; wrap your data in torch.utils.data.DataLoader"
                )

    @classmethod
    def from_tensors(
        cls,
        *tensors: torch.Tensor,
        batch_size: int = 64,
        valid_pct: float = 0.2,
        shuffle: bool = True,
        seed: int | None = None,
    ) -> DataLoaders:
        """Split in-memory tensors ``(x, y, ...)`` at random into a train and a valid ``DataLoader``.

        ``valid_pct`` of the samples (rounded down; ``0`` for none) go to the valid loader, which is never
        shuffled. ``seed`` fixes both the split and the train order; without it they come from torch's
        global generator.
        """
        n = _common_length(tensors)
        if not 0 <= valid_pct < 1:
            raise ValueError(f"DataLoaders.from_tensors: valid_pct={valid_pct} must be in [0, 1)")
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        order = torch.randperm(n, generator=generator)
        n_valid = int(n * valid_pct)
        train_idx, valid_idx = order[n_valid:], order[:n_valid]
        train = DataLoader(
            TensorDataset(*(t[train_idx] for t in tensors)),
            batch_size=batch_size,
            shuffle=shuffle,
            generator=generator,
        )
        if n_valid == 0:
            return cls(train)
        return cls(train, DataLoader(TensorDataset(*(t[valid_idx] for t in tensors)), batch_size=batch_size))


def as_dataloaders(dls: DataLoaders | tuple | list) -> DataLoaders:
    """Accept ``DataLoaders`` or a ``(train, valid)`` pair."""
    if isinstance(dls, DataLoaders):
        return dls
    if isinstance(dls, tuple | list) and len(dls) in (1, 2):
        return DataLoaders(*dls)
    raise TypeError(
        "Learner: dls must be hs.DataLoaders(train, valid) or a (train, valid) pair, "
        f"not {type(dls).__name__}"
    )


def _common_length(tensors: tuple[torch.Tensor, ...]) -> int:
    """The number of samples every tensor holds (dimension 0); refuses anything else with one message."""
    if not tensors or not all(isinstance(t, torch.Tensor) for t in tensors):
        kinds = ", ".join(type(t).__name__ for t in tensors) or "nothing"
        raise TypeError(f"DataLoaders.from_tensors: pass tensors (x, y, ...), got {kinds}")
    lengths = {len(t) for t in tensors}
    if len(lengths) != 1:
        raise ValueError(
            f"DataLoaders.from_tensors: the tensors hold {[len(t) for t in tensors]} samples; "
            "they must all hold the same number (dimension 0)"
        )
    return lengths.pop()


def require_batches(loader: Any, caller: str) -> None:
    """Raise a one-line ``ValueError`` when the training ``loader`` yields no batch: a fit over it would
    "succeed" without a single step (and an lr sweep would divide by its zero length)."""
    if len(loader) > 0:
        return
    raise ValueError(f"{caller}: the training loader yields no batch: {_why_empty(loader)}")


def _why_empty(loader: Any) -> str:
    """Why ``loader`` has no batch, and the fix, as precisely as its attributes tell."""
    dataset = getattr(loader, "dataset", None)
    size = len(dataset) if hasattr(dataset, "__len__") else None
    batch_size = getattr(loader, "batch_size", None)
    if size == 0:
        return f"its {type(dataset).__name__} holds 0 samples; give it a non-empty dataset"
    if size is not None and getattr(loader, "drop_last", False) and batch_size and size < batch_size:
        return (
            f"its {size} samples are fewer than batch_size={batch_size} and drop_last=True drops them; "
            "lower batch_size or set drop_last=False"
        )
    return f"the {type(loader).__name__} has length 0; give it some data"


def can_batch_in_memory(loader: Any) -> bool:
    """True when iterating ``loader`` is equivalent to indexing its tensors (see the module docstring)."""
    return (
        type(loader) is DataLoader  # a subclass may iterate differently
        and type(loader.dataset) is TensorDataset
        and loader.num_workers == 0
        and loader.collate_fn is default_collate
        and type(loader.batch_sampler) is BatchSampler
        and type(loader.sampler) in _INDEXABLE_SAMPLERS
    )


class TensorBatches:
    """Iterates a simple ``DataLoader`` over a ``TensorDataset`` by indexing tensors already on ``device``.

    Yields tuples of tensors equal to the loader's batches, in the same order. Like the loader's iterator,
    ``iter()`` draws the loader's base seed (from ``loader.generator`` or the global generator) and the
    sampler draws its own randomness at the first batch.
    """

    def __init__(self, loader: DataLoader, device: torch.device) -> None:
        self.loader = loader
        self.tensors = tuple(t.to(device) for t in loader.dataset.tensors)
        self.device = device
        self._sequential = type(loader.sampler) is SequentialSampler

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        torch.empty((), dtype=torch.int64).random_(generator=self.loader.generator)
        return self._batches()

    def _batches(self) -> Iterator[tuple[torch.Tensor, ...]]:
        size, n = self.loader.batch_size, len(self.loader.sampler)
        stop = n - n % size if self.loader.drop_last else n
        if self._sequential:
            # copies, like collate's: a callback changing a batch in place must not change the dataset
            for start in range(0, stop, size):
                yield tuple([t[start : start + size].clone() for t in self.tensors])
            return
        order = torch.tensor(list(self.loader.sampler), dtype=torch.int64).to(self.device)
        for start in range(0, stop, size):
            index = order[start : start + size]
            yield tuple([t.index_select(0, index) for t in self.tensors])


def batch_to_device(batch: Any, device: torch.device) -> tuple:
    """A loader's batch as a tuple of items on ``device``: a lone tensor becomes a 1-tuple."""
    if isinstance(batch, torch.Tensor):
        return (to_device(batch, device),)
    if isinstance(batch, tuple | list):
        return to_device(batch, device)
    raise TypeError(
        f"Learner: a batch must be a tensor or a tuple/list (inputs..., target), not {type(batch).__name__}; "
        "make the Dataset or collate_fn return tuples"
    )


def to_device(batch: Any, device: torch.device) -> Any:
    """Move the tensors of a batch to ``device`` asynchronously; a top-level tuple or list comes back as a
    tuple (the loop's ``(inputs..., target)``), nested values keep their own types (named tuples, dicts,
    dataclasses: :func:`~hookscope.hooks.tensors.map_tensors`)."""

    def move(tensor: torch.Tensor) -> torch.Tensor:
        return tensor if tensor.device == device else tensor.to(device, non_blocking=True)

    if isinstance(batch, tuple | list):
        return tuple([map_tensors(move, b) for b in batch])
    return map_tensors(move, batch)
