"""Bounded histories of per-step numbers: the recent steps one by one, the whole run in blocks.

:class:`Ring` keeps the last ``size`` rows exactly (the rules read them: outliers are single steps).
:class:`Blocks` keeps the whole run at most ``size`` rows long: each row is the mean of ``stride``
consecutive steps; when full, neighbouring rows are merged in pairs and ``stride`` doubles, so the run is
covered at an even density however long it gets (the report's breakdown over the run reads it).

A checkpoint holds both in single precision (seconds and bytes to 7 digits) and 32-bit steps: half the size.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


class Ring:
    """The last ``size`` rows of ``width`` values, each with its step."""

    def __init__(self, size: int, width: int) -> None:
        self.size, self.width = size, width
        self._steps = np.zeros(size, dtype=np.int64)
        self._rows = np.zeros((size, width))
        self.count = 0  # rows ever added

    def add(self, step: int, row: np.ndarray) -> None:
        slot = self.count % self.size
        self._steps[slot], self._rows[slot] = step, row
        self.count += 1

    def view(self, last: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(steps, rows) of the rows kept (the ``last`` ones), oldest first (copies)."""
        kept = min(self.count, self.size, self.size if last is None else last)
        order = np.arange(self.count - kept, self.count) % self.size
        return self._steps[order], self._rows[order]

    def state_dict(self) -> dict[str, Any]:
        steps, rows = self.view()
        return {"steps": torch.from_numpy(steps).int(), "rows": _saved(rows), "count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The rows :meth:`state_dict` saved, oldest first; the next row overwrites the oldest."""
        self._steps[:] = 0
        self._rows[:] = 0.0
        self.count = 0
        for step, row in zip(state["steps"].tolist(), state["rows"].double().numpy(), strict=True):
            self.add(step, row)


class Blocks:
    """The mean row of every ``stride`` consecutive steps, at most ``size`` rows (``stride`` doubles
    when full)."""

    def __init__(self, size: int, width: int) -> None:
        self.size, self.width = size, width
        self.stride = 1
        self.first_steps: list[int] = []
        self.means: list[np.ndarray] = []
        self._open_step: int | None = None
        self._open_sum = np.zeros(width)
        self._open_n = 0

    def add(self, step: int, row: np.ndarray) -> None:
        if self._open_step is None:
            self._open_step = step
        self._open_sum += row
        self._open_n += 1
        if self._open_n >= self.stride:
            self._close_open()

    def _close_open(self) -> None:
        self.first_steps.append(int(self._open_step))  # type: ignore[arg-type]
        self.means.append(self._open_sum / self._open_n)
        self._open_step, self._open_sum, self._open_n = None, np.zeros(self.width), 0
        if len(self.means) > self.size:
            self._halve()

    def _halve(self) -> None:
        if len(self.means) % 2:  # the unpaired last block stays open, to be filled to the new stride
            self._open_step, self._open_n = self.first_steps.pop(), self.stride
            self._open_sum = self.means.pop() * self.stride
        pairs = range(0, len(self.means), 2)
        self.means = [(self.means[i] + self.means[i + 1]) / 2 for i in pairs]
        self.first_steps = [self.first_steps[i] for i in pairs]
        self.stride *= 2

    def state_dict(self) -> dict[str, Any]:
        means = np.array(self.means).reshape(-1, self.width)
        return {
            "stride": self.stride,
            "first_steps": torch.tensor(self.first_steps, dtype=torch.int32),
            "means": _saved(means),
            "open": [-1 if self._open_step is None else self._open_step, self._open_n],
            "open_sum": torch.from_numpy(self._open_sum.copy()),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stride = int(state["stride"])
        self.first_steps = state["first_steps"].tolist()
        self.means = list(state["means"].double().numpy())
        step, self._open_n = state["open"]
        self._open_step = None if step < 0 else step
        self._open_sum = state["open_sum"].double().numpy().copy()


def _saved(rows: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(rows).float()
