"""The training loss history the loss rules read, bounded whatever the run length.

The doctor reads every training loss (in bulk, at each check) but keeps at most ``head + size`` of them:

- the first ``head`` losses, all of them: the loss rules measure "the start" there (the median of the
  first ``loss_window`` steps), and a run's first steps fall fastest, so thinning them would move it;
- after them, a subsample at rate 1 / 2**``level``: each time more than ``size`` are kept, ``level``
  grows and about every other kept loss is dropped, as the recorders thin their histories, so the kept
  losses span the whole run at an even density.

Which losses a level keeps is fixed by a hash of the loss's position (a loss kept at level L+1 is kept at
level L), not by "every k-th": a loss that alternates between two values (two kinds of batches, a
too-high learning rate) would alias to a flat line under every-k-th sampling, and a plateau rule would
then call an oscillating loss a plateau. Why a subsample instead of averaging pairs: ``stalled_loss``
compares medians and the 10th-90th percentile spread of its windows, which a subsample estimates without
bias, while averages shrink the spread (two averaged losses bounce ~1.4x less) and would hide an
oscillating loss. Its windows are an eighth of the kept losses, hence still an eighth of the run, and
``size`` (4096) is far above the 16 windows of ``stall_window`` it needs. ``loss_divergence`` does not read
this history: the engine feeds each :class:`~hookscope.doctor.rules.DivergenceScan` every loss as it is
read.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from hookscope.doctor.history_codec import series_from_state, series_state

HEAD = 64
SIZE = 4096
_MASK = (1 << 64) - 1


class LossHistory:
    """``(step, loss)`` pairs: the first ``head`` losses, then a hashed subsample of at most ``size``."""

    def __init__(self, head: int = HEAD, size: int = SIZE) -> None:
        self.head, self.size = head, size
        self.entries: list[tuple[int, float]] = []  # what the rules read: the head, then the subsample
        self.level = 0  # the subsample keeps a loss whose position's hash has ``level`` low zero bits
        self.total = 0  # losses offered so far, kept or not
        self._positions: list[int] = []  # the position (count from the first loss) of each kept loss

    def extend(self, losses: Iterable[tuple[int, float]]) -> None:
        """Offer these losses, oldest first."""
        for pair in losses:
            position, self.total = self.total, self.total + 1
            if position >= self.head and not _kept(position, self.level):
                continue
            self.entries.append(pair)
            self._positions.append(position)
            while len(self.entries) > self.head + self.size:
                self._thin()

    def __len__(self) -> int:
        return len(self.entries)

    def state_dict(self) -> dict[str, Any]:
        return {
            **series_state(self.entries),
            "position": torch.tensor(self._positions, dtype=torch.int64),
            "level": self.level,
            "total": self.total,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved; a plain ``{step, value}`` series (older checkpoints kept
        every loss) is offered again, so it is bounded as it loads."""
        series = series_from_state(state)
        self.entries, self._positions, self.level, self.total = [], [], 0, 0
        if "level" not in state:
            self.extend(series)
            return
        self.entries, self._positions = series, state["position"].tolist()
        self.level, self.total = int(state["level"]), int(state["total"])

    def _thin(self) -> None:
        """Go one level up: drop the kept losses after the head that the next level does not keep."""
        self.level += 1
        kept = [
            i for i, position in enumerate(self._positions) if i < self.head or _kept(position, self.level)
        ]
        self.entries = [self.entries[i] for i in kept]
        self._positions = [self._positions[i] for i in kept]


def _kept(position: int, level: int) -> bool:
    """Whether level ``level`` keeps the loss at ``position``: the low ``level`` bits of its hash (the
    splitmix64 finaliser, so that positions in any arithmetic progression spread over all levels) are 0."""
    z = (position + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return (z ^ (z >> 31)) & ((1 << level) - 1) == 0
