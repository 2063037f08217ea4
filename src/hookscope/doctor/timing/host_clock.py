"""Phase times on the host: one ``time.perf_counter`` per phase change, summed into the step's row.

Used when the model runs on the CPU, where the host's clock is the computation's clock.
"""

from __future__ import annotations

import time

import numpy as np

from hookscope.doctor.timing.phases import COLUMNS, GC, WAIT, callbacks_to_other


class HostClock:
    """Adds the time since the last mark to the phase that just ended; :meth:`close` hands the step's row
    over and starts the next one."""

    def __init__(self) -> None:
        self._row = [0.0] * len(COLUMNS)  # a list: adding to it costs less than to an array
        self._last = time.perf_counter()
        self._marked = False
        self._done: list[tuple[int, list[float]]] = []  # lists: arrays are made in bulk, at take

    def mark(self, ended: int) -> None:
        """Phase ``ended`` ends now."""
        now = time.perf_counter()
        self._row[ended] += now - self._last
        self._last, self._marked = now, True

    def close(
        self, step: int, gc_seconds: float, wait_seconds: float = 0.0, callback_seconds: float = 0.0
    ) -> None:
        """The step ``step`` ended (its last phase was marked just before; nothing marked: no step), with
        the collector's seconds, the thread's wait for a core and the callbacks' seconds in its data
        phase."""
        if not self._marked:
            return
        self._marked = False
        row, self._row = self._row, [0.0] * len(COLUMNS)
        row[GC], row[WAIT] = gc_seconds, wait_seconds
        callbacks_to_other(row, callback_seconds)
        self._done.append((step, row))

    @property
    def waiting(self) -> int:
        """Steps closed and not taken yet."""
        return len(self._done)

    def take(self, wait: bool = False) -> list[tuple[int, np.ndarray]]:
        """The rows of the steps closed since the last take, oldest first (``wait``: nothing to wait
        for on the host)."""
        done, self._done = self._done, []
        if not done:
            return []
        table = np.array([row for _, row in done])
        return [(step, row) for (step, _), row in zip(done, table, strict=True)]

    def restart(self) -> None:
        """Forget the time since the last mark (after a pause the loop did not tell us about)."""
        self._last = time.perf_counter()
        self._row = [0.0] * len(COLUMNS)
