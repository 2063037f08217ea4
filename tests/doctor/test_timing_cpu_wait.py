"""A busy machine is no stall: the training thread's wait for a core (``/proc/thread-self/schedstat``) is
taken out of a step's time before it is judged; a sleep, a disk or a lock is no wait for a core."""

import os
import subprocess
import sys
import time

import numpy as np
import pytest

from hookscope.doctor.timing.cpu_wait import CpuWait
from hookscope.doctor.timing.phases import COLUMNS, DATA, WAIT
from hookscope.doctor.timing.stalls import StallDetector

needs_schedstat = pytest.mark.skipif(
    not os.path.exists("/proc/thread-self/schedstat") or not hasattr(os, "sched_setaffinity"),
    reason="Linux scheduler statistics and CPU affinity",
)


def busy(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@needs_schedstat
def test_sharing_one_core_with_a_busy_process_is_waiting_and_sleeping_is_not():
    wait = CpuWait()
    wait.take()
    time.sleep(0.2)
    slept = wait.take()
    cores = os.sched_getaffinity(0)
    core = min(cores)
    os.sched_setaffinity(0, {core})
    rival = subprocess.Popen(
        [sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{core}}})\nwhile True: pass"]
    )
    try:
        time.sleep(0.1)  # the rival runs
        wait.take()
        start = time.perf_counter()
        busy(0.4)
        shared = time.perf_counter() - start
        waited = wait.take()
    finally:
        rival.kill()
        rival.wait()
        os.sched_setaffinity(0, cores)
        wait.close()
    assert slept < 0.5 * 0.2  # asleep, the thread waits for no core
    assert waited > 0.25 * shared  # two busy threads on one core: each waits about half the time


def rows(n, stalled, where):
    """``n`` steps of 10 ms; the ``stalled`` ones 300 ms longer, the extra time in ``where``."""
    table = np.zeros((n, len(COLUMNS)))
    table[:, DATA] = 0.010
    for i in stalled:
        table[i, DATA] += 0.3
        if where == "wait":
            table[i, WAIT] = 0.3
    return table


def test_a_step_the_machine_slowed_is_no_stall_and_one_the_loop_slowed_is():
    steps = np.arange(120)
    for where, found in (("wait", []), ("loop", [30, 55, 80, 105])):
        detector = StallDetector()
        table = rows(120, [30, 55, 80, 105], where)
        for end in range(20, 121):
            detector.judge(steps[:end], table[:end], 1 if end > 20 else 20, {})
        assert [s.step for s in detector.stalls] == found
