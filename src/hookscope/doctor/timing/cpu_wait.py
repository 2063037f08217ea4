"""How long the training's threads waited for a core: the machine's share of a slow step.

On a machine shared with other processes the scheduler takes the cores away now and then; a thread is
then runnable but not running. Linux counts that time per thread (``/proc/self/task/<tid>/schedstat``,
its second field: nanoseconds spent waiting on a run queue), so a step slowed by the machine can be told
from one slowed by the loop: a sleep, a disk or a lock is no wait for a core, a busy machine is. The
training thread waits for its intra-op threads (a parallel region ends when the slowest worker does), so
the wait of a step is the longest any of them waited: the training thread's and that of the
:data:`BUSIEST` threads that used the most CPU since the last :meth:`CpuWait.choose` (when the rules run)
— those that used :data:`HELPER` of the training thread's CPU time at least: one thread reads one file.
Where the files are missing (another system, a kernel without scheduler statistics) the wait reads as 0.
:attr:`CpuWait.parallel` says whether other threads computed alongside the training thread since the last
choice: the wait is then each thread's own and tells the machine's part of a step less exactly.

A read of ``schedstat`` costs tens of microseconds inside a step (the kernel formats the file; the step's
tensors have pushed its code out of the caches), where the thread's CPU clock costs one. A thread waiting
for a core is off it, so when the training thread computes alone and spent less than :data:`OFF_CPU` of
the time since the last take off its core, its wait was shorter still: it reads as 0 and the file is not
read. A step with more time off the core (a busy machine, a sleep, a lock, a slow loader) reads it, and
its wait is at most that time (the waits of the unread steps before it were each below their share).
"""

from __future__ import annotations

import os
import threading
import time

BUSIEST = 4  # other threads read at every step at most: the intra-op pool that computes the step
HELPER = 0.1  # of the training thread's CPU time: another thread that used this much computed with it
OFF_CPU = 0.02  # of the time since the last take: a training thread off its core for less waited less
_TASKS = "/proc/self/task"


class CpuWait:
    """Seconds the training thread, or the busiest of the others, waited for a core since the last
    :meth:`take` (a few ``pread``). The training thread is the one that calls :meth:`choose` first."""

    def __init__(self) -> None:
        self._files: dict[int, int] = {}  # thread id -> open schedstat file
        self._last: dict[int, tuple[int, int]] = {}  # thread id -> (cpu ns, wait ns) at the last read
        self._cpu_at_choice: dict[int, int] = {}  # thread id -> cpu ns at the last choice
        self._main: int | None = None
        self._missing = not os.path.isdir(_TASKS)
        self._wall, self._cpu = time.perf_counter(), time.thread_time()  # at the last take
        self.parallel = False  # other threads computed with the training thread since the last choice

    def choose(self) -> None:
        """Follow the training thread and the threads that used the most CPU since the last choice."""
        if self._missing:
            return
        if self._main is None:
            self._main = threading.get_native_id()
        cpu = {tid: now[0] for tid in map(int, os.listdir(_TASKS)) if (now := _read_path(tid)) is not None}
        used = {tid: ns - self._cpu_at_choice.get(tid, 0) for tid, ns in cpu.items()}
        self._cpu_at_choice = cpu  # every thread's, so that a long-lived pool's past does not count
        floor = HELPER * used.get(self._main, 0)
        helpers = [tid for tid in used if tid != self._main and used[tid] >= floor > 0]
        self.parallel = bool(helpers)
        chosen = {self._main, *sorted(helpers, key=used.__getitem__, reverse=True)[:BUSIEST]}
        for tid in set(self._files) - chosen:
            os.close(self._files.pop(tid))
            self._last.pop(tid, None)
        for tid in chosen - set(self._files):
            try:
                self._files[tid] = os.open(f"{_TASKS}/{tid}/schedstat", os.O_RDONLY)
            except OSError:
                continue  # the thread ended
            self._last[tid] = _read(self._files[tid])

    def take(self) -> float:
        """The longest wait for a core of a followed thread since the last take, in seconds (called by
        the training thread: its CPU clock is read)."""
        wall, cpu = time.perf_counter(), time.thread_time()
        elapsed, off = wall - self._wall, (wall - self._wall) - (cpu - self._cpu)
        self._wall, self._cpu = wall, cpu
        if not self.parallel and off < OFF_CPU * elapsed:
            return 0.0  # see the module: no file read
        longest = 0
        for tid, fd in self._files.items():
            try:
                now = _read(fd)
            except OSError:
                continue  # the thread ended: the next choice drops it
            waited = now[1] - self._last[tid][1]
            if tid == self._main:  # since an earlier take, maybe: this take's share is at most its time off
                waited = min(waited, int(off * 1e9))
            longest = max(longest, waited)
            self._last[tid] = now
        return longest / 1e9

    def close(self) -> None:
        for fd in self._files.values():
            os.close(fd)
        self._files, self._last, self._cpu_at_choice, self._main = {}, {}, {}, None


def _read(fd: int) -> tuple[int, int]:
    cpu, wait = os.pread(fd, 128, 0).split()[:2]
    return int(cpu), int(wait)


def _read_path(tid: int) -> tuple[int, int] | None:
    try:
        fd = os.open(f"{_TASKS}/{tid}/schedstat", os.O_RDONLY)
    except OSError:
        return None
    try:
        return _read(fd)
    except OSError:
        return None
    finally:
        os.close(fd)
