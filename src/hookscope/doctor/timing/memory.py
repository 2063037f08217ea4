"""The process's memory, read cheaply at the end of a step, and the most it can reach.

On CUDA: ``torch.cuda.memory_allocated`` (a host-side counter of the caching allocator, no
synchronisation) against the device's total memory. On the CPU: the process's resident memory, from
``/proc/self/statm`` on Linux (one read of an open file) or ``psutil`` where it is installed, against the
machine's physical memory — less, with glibc, the memory ``malloc`` holds free (``mallinfo2``): a
long-lived process keeps freed memory resident and refills it first, so a leak would not move the
resident size until that memory is used up; in use, it grows from the first step. Outputs kept with
their graphs, the usual leak, refill it: the resident size alone would miss them.
``mallinfo2`` walks malloc's free lists, which lengthen with every fit a process runs (measured: 1 us
at the start, 270 us after eleven small fits, 12,000 free chunks holding 1 MB; up to 1.5 ms late in a
long process). :class:`MemoryCadence` keeps that cost bounded: after the samples the rule needs at the
start, a read that costs more than :data:`BUDGET` of the time since the one before doubles the interval,
its cost counted as :data:`AFTERMATH` times its own time.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable

import torch

from hookscope.doctor.timing.memory_growth import SEGMENT, SEGMENTS

# Samples at the base interval whatever they cost: what memory_growth's first verdict needs, so it comes as
# promptly as ever. No more: a walk costs the step after it several times its own time (it empties the
# caches the step's kernels use), which the budget below cannot see.
DENSE = SEGMENT * SEGMENTS
BUDGET = 0.0025  # of the time between two reads, at most, once the dense samples are taken
# A walk visits every free chunk, spread over the heap, and the steps after it run on the caches it emptied:
# measured in stop 37 (docs/benchmarks.md), reads of 7-22 ms in all a fit cost the fit about 4.7 points
# (130 ms) of the small CNN's time. Its own time, times this, is what the budget weighs.
AFTERMATH = 6
MAX_FACTOR = 16  # the interval grows to 16 x the base at most: a late leak shows within 18 x 16 x base steps

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class MemoryProbe:
    """``read()`` gives the bytes in use now; ``total`` the most there is; ``what`` names both."""

    def __init__(self, device: torch.device) -> None:
        self.read: Callable[[], int]
        if device.type == "cuda":
            self.what, self.where = "CUDA allocated memory", f"the device's {device}"
            self.read = lambda: torch.cuda.memory_allocated(device)
            self.total = torch.cuda.get_device_properties(device).total_memory
            return
        self.what, self.where = "the process's resident memory in use", "the machine's"
        self.total = _physical_memory()
        self.read = _in_use(_resident_reader())

    def close(self) -> None:
        """Release the open file of the resident-memory reader."""
        close = getattr(self.read, "close", None)
        if close is not None:
            close()


class MemoryCadence:
    """When to read the memory: every ``every`` steps; with ``adaptive``, past the first :data:`DENSE`
    samples from step ``warmup`` on (those the rule reads), the interval doubles (up to
    :data:`MAX_FACTOR` times ``every``) after a read whose cost (:data:`AFTERMATH` times its own time)
    was more than :data:`BUDGET` of the time since the read before, and halves back after one that cost
    less than a quarter of that. A leak grows at every step, so sparser samples still show it, later; a
    growing heap walk (``mallinfo2``) then costs at most about a quarter of a percent of the training
    time, the caches it empties included. A walk of a fresh process (about 1 us) keeps the base interval."""

    def __init__(self, every: int, adaptive: bool, warmup: int = 0) -> None:
        self.base = self.every = every
        self.adaptive, self.warmup = adaptive, warmup
        self.taken = 0  # reads from step ``warmup`` on
        self.next = 0  # the next step read
        self._last: float | None = None  # when the last read ended (seconds)

    def due(self, step: int) -> bool:
        return step >= self.next

    def restart(self, step: int, warmup: int) -> None:
        """A resumed process starts at ``step`` and warms up until ``warmup``: read from ``step`` on as at
        the run's start, densely past the warm-up (the samples the rule reads), at the base interval."""
        self.warmup, self.taken, self.every, self.next, self._last = warmup, 0, self.base, step, None

    def read(self, step: int, started: float, ended: float) -> None:
        """Step ``step`` was read from ``started`` to ``ended`` (seconds of one clock): set the next one."""
        since, self._last = (started - self._last if self._last is not None else None), ended
        if step >= self.warmup:
            self.taken += 1
        if self.adaptive and self.taken > DENSE and since is not None and since > 0:
            share = AFTERMATH * (ended - started) / since
            if share > BUDGET and self.every < self.base * MAX_FACTOR:
                self.every *= 2
            elif share < BUDGET / 4 and self.every > self.base:
                self.every //= 2
        self.next = step - step % self.base + self.every


class _Statm:
    """The resident set size from ``/proc/self/statm``, read from an open file (re-read at offset 0)."""

    def __init__(self) -> None:
        self._fd: int | None = os.open("/proc/self/statm", os.O_RDONLY)

    def __call__(self) -> int:
        if self._fd is None:
            self._fd = os.open("/proc/self/statm", os.O_RDONLY)
        return int(os.pread(self._fd, 128, 0).split()[1]) * _PAGE

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _resident_reader() -> Callable[[], int]:
    if os.path.exists("/proc/self/statm"):
        return _Statm()
    try:
        import psutil
    except ImportError:
        return lambda: 0  # no cheap way to read it here: memory_growth stays silent
    process = psutil.Process()
    return lambda: process.memory_info().rss


_MALLINFO2 = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks")


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2``: ``fordblks`` is the bytes free in malloc's arenas."""

    _fields_ = [(name, ctypes.c_size_t) for name in (*_MALLINFO2, "keepcost")]


class _InUse:
    """The resident size less the bytes glibc's ``malloc`` holds free (its arenas' free chunks), and never
    less than the bytes ``malloc`` has handed out: a free chunk need not be resident (a ``calloc``'d block
    never written, then freed: measured, 1.6 GB of ``np.zeros`` freed took the estimate from 549 to 27 MB,
    and further takes it below 0), so the difference alone can fall below what is surely in use."""

    def __init__(self, resident: Callable[[], int], mallinfo2: Callable[[], _MallInfo2]) -> None:
        self.resident, self.mallinfo2 = resident, mallinfo2

    def __call__(self) -> int:
        info = self.mallinfo2()
        return max(self.resident() - int(info.fordblks), int(info.uordblks) + int(info.hblkhd))

    def close(self) -> None:
        close = getattr(self.resident, "close", None)
        if close is not None:
            close()


def _in_use(resident: Callable[[], int]) -> Callable[[], int]:
    """``resident`` less malloc's free memory where glibc tells it (2.33 and later), else ``resident``."""
    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except (AttributeError, OSError):
        return resident
    mallinfo2.restype, mallinfo2.argtypes = _MallInfo2, []
    return _InUse(resident, mallinfo2)


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * _PAGE
    except (AttributeError, ValueError, OSError):
        return 0
