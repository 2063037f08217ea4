"""What a DataLoader is set to, and the machine's cores: the numbers ``input_bound``'s advice names."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the system tells it, else all)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


@dataclass(frozen=True)
class LoaderSettings:
    """The settings of a ``torch.utils.data.DataLoader`` that decide how fast batches arrive."""

    num_workers: int
    pin_memory: bool
    persistent_workers: bool
    prefetch_factor: int | None

    @classmethod
    def of(cls, loader: Any) -> LoaderSettings | None:
        """The settings of ``loader`` (None: not a DataLoader-like object)."""
        if not hasattr(loader, "num_workers"):
            return None
        workers = int(loader.num_workers)
        return cls(
            num_workers=workers,
            pin_memory=bool(getattr(loader, "pin_memory", False)),
            persistent_workers=bool(getattr(loader, "persistent_workers", False)),
            prefetch_factor=getattr(loader, "prefetch_factor", None) if workers else None,
        )

    def describe(self) -> str:
        prefetch = f", prefetch_factor={self.prefetch_factor}" if self.num_workers else ""
        return (
            f"num_workers={self.num_workers}, pin_memory={self.pin_memory}, "
            f"persistent_workers={self.persistent_workers}{prefetch}"
        )

    def advice(self, cores: int, cuda: bool) -> list[str]:
        """What to change, most effective first."""
        tips = []
        if self.num_workers == 0:
            tips.append(
                f"load in worker processes: num_workers=0 prepares every batch in the training process; "
                f"try num_workers={max(2, min(8, cores - 1))} (this machine gives the process {cores} cores)"
            )
        elif self.num_workers < cores - 1:
            tips.append(
                f"raise num_workers={self.num_workers} towards {cores - 1} (this machine gives the process "
                f"{cores} cores)"
            )
        else:
            tips.append(
                f"the {self.num_workers} workers already use the process's {cores} cores: make each batch "
                "cheaper to prepare"
            )
        if cuda and not self.pin_memory:
            tips.append("pin_memory=True makes the copy to the GPU faster and asynchronous")
        if self.num_workers and not self.persistent_workers:
            tips.append("persistent_workers=True keeps the workers alive between epochs")
        if self.num_workers and (self.prefetch_factor or 2) <= 2:
            tips.append(
                f"prefetch_factor={self.prefetch_factor or 2}: a larger one evens out batches that vary "
                "in cost"
            )
        return tips
