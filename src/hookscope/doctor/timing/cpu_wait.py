"""How long the training thread waited for a core: the machine's share of a slow step.

On a machine shared with other processes the scheduler takes the cores away now and then; the thread is
then runnable but not running. Linux counts that time per thread (``/proc/thread-self/schedstat``, its
second field: nanoseconds spent waiting on a run queue), so a step slowed by the machine can be told from
one slowed by the loop: a sleep, a disk or a lock is no wait for a core, a busy machine is. Where the file
is missing (another system, a kernel without scheduler statistics) the wait reads as 0.
"""

from __future__ import annotations

import os

_SCHEDSTAT = "/proc/thread-self/schedstat"


class CpuWait:
    """Seconds the calling thread waited for a core since the last :meth:`take` (one ``pread``). The
    file is opened by the first take, so it is the thread that calls it — the training loop's."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._last = 0
        self._missing = not os.path.exists(_SCHEDSTAT)

    def take(self) -> float:
        if self._missing:
            return 0.0
        if self._fd is None:
            self._fd = os.open(_SCHEDSTAT, os.O_RDONLY)
            self._last = self._read()
        now = self._read()
        waited, self._last = now - self._last, now
        return waited / 1e9

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _read(self) -> int:
        return int(os.pread(self._fd, 128, 0).split()[1])  # type: ignore[arg-type]
