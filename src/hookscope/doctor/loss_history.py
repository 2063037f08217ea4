"""The training loss history the loss rules read, bounded whatever the run length.

The doctor reads every training loss (in bulk, at each check) but keeps at most ``head + size`` of them:

- the first ``head`` losses, all of them: the loss rules measure "the start" there (the median of the
  first ``loss_window`` steps), and a run's first steps fall fastest, so thinning them would move it;
- after them every ``every``-th loss, ``every`` doubling each time more than ``size`` are kept (every
  other kept loss is then dropped), as the recorders thin their histories: the kept losses span the
  whole run at an even density.

Why keep a subsample instead of averaging pairs: ``stalled_loss`` compares medians and the 10th-90th
percentile spread of its windows, which a subsample estimates without bias while averages shrink the
spread (two averaged losses bounce ~1.4x less) and would hide an oscillating loss. Its windows are an
eighth of the kept losses, hence still an eighth of the run, and ``size`` (4096) is far above the 16
windows of ``stall_window`` it needs. ``loss_divergence`` does not read this history: the engine feeds
each :class:`~hookscope.doctor.rules.DivergenceScan` every loss as it is read.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hookscope.doctor.history_codec import series_from_state, series_state

HEAD = 64
SIZE = 4096


class LossHistory:
    """``(step, loss)`` pairs: the first ``head`` losses, then every ``every``-th, at most ``size`` of
    those."""

    def __init__(self, head: int = HEAD, size: int = SIZE) -> None:
        self.head, self.size = head, size
        self.entries: list[tuple[int, float]] = []  # what the rules read: the head, then the thinned rest
        self.every = 1
        self.total = 0  # losses offered so far, kept or not

    def extend(self, losses: Iterable[tuple[int, float]]) -> None:
        """Offer these losses, oldest first."""
        for pair in losses:
            position = self.total - self.head  # among the losses after the head
            self.total += 1
            if position >= 0 and position % self.every:
                continue
            self.entries.append(pair)
            if len(self.entries) > self.head + self.size:
                del self.entries[self.head + 1 :: 2]
                self.every *= 2

    def __len__(self) -> int:
        return len(self.entries)

    def state_dict(self) -> dict[str, Any]:
        return {**series_state(self.entries), "every": self.every, "total": self.total}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved; a plain ``{step, value}`` series (older checkpoints kept
        every loss) is offered again, so it is bounded as it loads."""
        series = series_from_state(state)
        self.entries, self.every, self.total = [], 1, 0
        if "every" not in state:
            self.extend(series)
            return
        self.entries, self.every, self.total = series, int(state["every"]), int(state["total"])
