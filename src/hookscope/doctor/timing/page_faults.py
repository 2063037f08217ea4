"""``page_faults``: the steps spend their time in the kernel, faulting in memory the allocator gave back.

glibc's ``malloc`` serves a block over its mmap threshold (128 KB at the start; it rises to the largest
block freed, 32 MB at most) from a mapping of its own, which it unmaps when the block is freed, and it
hands the free top of its heap back to the system once that passes the trim threshold. A training step
frees its activations and gradients and allocates them again in the next one, so a process can end up
faulting in every page of them at every step: the kernel maps and zeroes each 4 KB page. Whether a
process falls into it depends on the sizes it allocated before, so one run faults and the next does not.
Measured with ``benchmarks/page_faults.py`` (ResNet18 on the CPU with ``Doctor()``, fresh processes):
18,336 faults and 28.6 ms in the kernel of a 112.5 ms step; 78.2 ms a step after :func:`keep_freed_memory`.

:class:`KernelCounters` reads the process's minor page faults and its system CPU time (``getrusage``,
one system call) at the end of every training step on the CPU; :func:`page_faults` judges the recent
steps (after the warm-up). It speaks when the median step takes :data:`MIN_FAULTS` faults or more and
spends :data:`MIN_SHARE` of its time (and :data:`MIN_KERNEL`) or more in the kernel, more than its whole
data phase (a loader that reads files or memory-maps its data faults there), while the memory in use
stays flat: memory that grows faults too, and is ``memory_growth``'s.

The fix sets the two thresholds: in the environment before Python starts (:data:`FIX`), or from the
running process (a notebook's kernel) with :func:`keep_freed_memory`.
"""

from __future__ import annotations

import ctypes
import os

import numpy as np

from hookscope.doctor.findings import Finding
from hookscope.doctor.timing.memory_growth import robust_slope
from hookscope.doctor.timing.phases import DATA, STEP_PHASES

try:
    import resource
except ImportError:  # Windows: no getrusage, so no counters
    resource = None  # type: ignore[assignment]

MIN_FAULTS = 256  # a step: 1 MB of 4 KB pages
MIN_SHARE = 0.1  # of the step's time, in the kernel
MIN_KERNEL = 0.5e-3  # seconds a step
MIN_STEPS = 20
FLAT = 0.1  # the memory in use may grow by this share of the bytes faulted a step and still be flat
KERNEL, FAULTS = range(2)  # the columns of a counters row

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
# The thresholds that end it: the largest mmap threshold glibc takes (blocks up to 32 MB come from the heap
# and stay there), and a trim threshold of 1 GB (the heap's free top stays with the process).
MMAP_THRESHOLD, TRIM_THRESHOLD = 32 << 20, 1 << 30
FIX = f"MALLOC_MMAP_THRESHOLD_={MMAP_THRESHOLD} MALLOC_TRIM_THRESHOLD_={TRIM_THRESHOLD}"
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters, from glibc's malloc.h


def keep_freed_memory() -> bool:
    """Have glibc's ``malloc`` keep the memory a training step frees for the next step, in the running
    process: what :data:`FIX` does from the environment, for a process already started (a notebook's
    kernel). Call it before training: blocks of up to 32 MB then come from the heap and stay there, and
    up to 1 GB of its free top stays with the process, so a step no longer faults in what the step
    before freed (``page_faults``). True where it applied; False where the C library has no ``mallopt``
    (not glibc), and nothing changed."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError):
        return False
    mallopt.restype, mallopt.argtypes = ctypes.c_int, [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )


class KernelCounters:
    """The process's system CPU time (seconds) and minor page faults since the last :meth:`take`."""

    def __init__(self) -> None:
        self._last = _now()

    @staticmethod
    def available() -> bool:
        """Whether the system counts them (``getrusage``: not on Windows)."""
        return resource is not None

    def take(self) -> tuple[float, int]:
        """(kernel seconds, faults) since the last take or :meth:`restart`."""
        now = _now()
        last, self._last = self._last, now
        return now[0] - last[0], now[1] - last[1]

    def restart(self) -> None:
        """What ran since the last take belongs to no step (the doctor's check, a validation pass)."""
        self._last = _now()


def _now() -> tuple[float, int]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_stime, usage.ru_minflt


def page_faults(
    steps: np.ndarray,
    rows: np.ndarray,
    counters: np.ndarray,
    memory_steps: np.ndarray,
    memory: np.ndarray,
) -> Finding | None:
    """The finding when the recent ``steps`` (timing ``rows``, kernel ``counters`` rows aligned with them)
    fault and spend their time in the kernel while the ``memory`` in use (samples at ``memory_steps``)
    stays flat."""
    if len(steps) < MIN_STEPS:
        return None
    faults, kernel = counters[:, FAULTS], counters[:, KERNEL]
    totals, data = rows[:, :STEP_PHASES].sum(axis=1), rows[:, DATA]
    if not _holds(faults, kernel, totals, data):
        return None
    per_step = float(np.median(faults))
    inside = (memory_steps >= steps[0]) & (memory_steps <= steps[-1])
    growth = robust_slope(memory_steps[inside], memory[inside]) if inside.sum() >= 3 else 0.0
    if growth > FLAT * per_step * _PAGE:
        return None
    seconds, total = float(np.median(kernel)), float(np.median(totals))
    share = round(seconds / total, 4)
    clear = next(
        k for k in range(MIN_STEPS, len(steps) + 1) if _holds(faults[:k], kernel[:k], totals[:k], data[:k])
    )
    megabytes = per_step * _PAGE / 2**20
    message = (
        f"each training step takes {per_step:,.0f} page faults ({megabytes:.1f} MB) and spends "
        f"{share:.0%} of its time in the kernel (median {_ms(seconds)} of {_ms(total)}, steps "
        f"{int(steps[0])}-{int(steps[-1])}), while the memory in use stays flat: the allocator gives back "
        "the memory each step frees and the system maps and zeroes it again in the next. glibc's malloc "
        "does it to blocks over its mmap and trim thresholds, depending on what the process allocated "
        f"before. The fix: start Python with {FIX} in its environment (or jemalloc or tcmalloc in "
        "LD_PRELOAD), or call hookscope.doctor.timing.keep_freed_memory() before training (a notebook)."
    )
    evidence = {
        "faults_per_step": round(per_step, 1),
        "kernel_ms": round(seconds * 1e3, 3),
        "step_ms": round(total * 1e3, 3),
        "share": share,
        "memory_growth_per_step": round(growth, 1),
    }
    return Finding("page_faults", "", int(steps[clear - 1]), "warning", message, evidence)


def _holds(faults: np.ndarray, kernel: np.ndarray, totals: np.ndarray, data: np.ndarray) -> bool:
    seconds = float(np.median(kernel))
    return (
        float(np.median(faults)) >= MIN_FAULTS
        and seconds >= MIN_KERNEL
        and seconds >= MIN_SHARE * float(np.median(totals))
        and seconds > float(np.median(data))
    )


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"
