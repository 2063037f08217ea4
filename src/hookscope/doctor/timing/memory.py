"""The process's memory, read cheaply at the end of a step, and the most it can reach.

On CUDA: ``torch.cuda.memory_allocated`` (a host-side counter of the caching allocator, no
synchronisation) against the device's total memory. On the CPU: the process's resident memory, from
``/proc/self/statm`` on Linux (one read of an open file) or ``psutil`` where it is installed, against the
machine's physical memory.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

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
        self.what, self.where = "the process's resident memory", "the machine's"
        self.total = _physical_memory()
        self.read = _resident_reader()

    def close(self) -> None:
        """Release the open file of the resident-memory reader."""
        close = getattr(self.read, "close", None)
        if close is not None:
            close()


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


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * _PAGE
    except (AttributeError, ValueError, OSError):
        return 0
