"""A ring of rows on the device, written one row per event and read to the host in bulk at a check.

The per-step path only writes into a preallocated row (no allocation, no host read); :meth:`DeviceRing.take`
turns the rows written since the last read into host arrays, keyed by the step each was committed at, and
the number of values written in it. At most ``rows`` events are kept between two reads: older ones are
overwritten (a check every 20 steps never comes near the default 64).
"""

from __future__ import annotations

from collections import deque

import numpy as np
import torch


class DeviceRing:
    """``rows`` x ``width`` values of ``dtype`` on the device of the first row asked for."""

    def __init__(self, rows: int, width: int, dtype: torch.dtype = torch.float32) -> None:
        self.rows, self.width, self.dtype = rows, width, dtype
        self.buffer: torch.Tensor | None = None
        self._rows: list[torch.Tensor] = []  # views of the buffer's rows, made once
        self._cut: dict[int, list[torch.Tensor]] = {}  # the rows' first n values, per n, made once
        self._written = 0
        self._pending: deque[tuple[int, int, int]] = deque(maxlen=rows)  # (slot, step, used), oldest first

    def row(self, device: torch.device, used: int | None = None) -> torch.Tensor:
        """The row the next event writes, or its first ``used`` values (a view; the same until
        :meth:`commit`)."""
        slot = self._written % self.rows
        row = self._rows[slot] if self._rows else None
        if row is None or row.device != device:
            self.buffer = torch.zeros(self.rows, self.width, dtype=self.dtype, device=device)
            self._rows = list(self.buffer.unbind(0))
            self._cut = {}
            self._pending.clear()
            row = self._rows[slot]
        if used is None or used == self.width:
            return row
        if used not in self._cut:
            self._cut[used] = [r[:used] for r in self._rows]
        return self._cut[used][slot]

    def commit(self, step: int, used: int | None = None) -> None:
        """The row written last is this step's; ``used``: how many of its first values were written."""
        self._pending.append((self._written % self.rows, step, self.width if used is None else used))
        self._written += 1

    def pending(self) -> torch.Tensor | None:
        """The rows committed since the last read, oldest first, cut to the widest use (None: none)."""
        if not self._pending or self.buffer is None:
            return None
        first, last = self._pending[0][0], self._pending[-1][0]
        used = max(used for _, _, used in self._pending)
        if first <= last:
            return self.buffer[first : last + 1, :used]
        return torch.cat([self.buffer[first:, :used], self.buffer[: last + 1, :used]])

    def take(self, host: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """(step, used part of the row) of every committed row not read yet, oldest first, from the host
        copy of :meth:`pending`."""
        rows = [(step, host[i, :used]) for i, (_, step, used) in enumerate(self._pending)]
        self._pending.clear()
        return rows
