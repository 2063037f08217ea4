"""A ring of rows on the device, written one row per event and read to the host in bulk at a check.

The per-step path only writes into a preallocated row (no allocation, no host read); :meth:`DeviceRing.take`
turns the rows written since the last read into host arrays, keyed by the step each was committed at. At
most ``rows`` events are kept between two reads: older ones are overwritten (a check every 10 steps never
comes near the default 64).
"""

from __future__ import annotations

from collections import deque

import numpy as np
import torch


class DeviceRing:
    """``rows`` x ``width`` float32 values on the device of the first row asked for."""

    def __init__(self, rows: int, width: int) -> None:
        self.rows, self.width = rows, width
        self.buffer: torch.Tensor | None = None
        self._written = 0
        self._pending: deque[tuple[int, int]] = deque(maxlen=rows)  # (slot, step), oldest first

    def row(self, device: torch.device) -> torch.Tensor:
        """The row the next event writes (a view; the same row until :meth:`commit`)."""
        if self.buffer is None or self.buffer.device != device:
            self.buffer = torch.zeros(self.rows, self.width, device=device)
            self._pending.clear()
        return self.buffer[self._written % self.rows]

    def commit(self, step: int) -> None:
        """The row written last is this step's."""
        self._pending.append((self._written % self.rows, step))
        self._written += 1

    def pending(self) -> torch.Tensor | None:
        """The buffer to read when rows were committed since the last read, else None."""
        return self.buffer if self._pending else None

    def take(self, host: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """(step, row) of every committed row not read yet, oldest first, from the host copy of the buffer."""
        rows = [(step, host[slot]) for slot, step in self._pending]
        self._pending.clear()
        return rows
