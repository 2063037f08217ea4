"""A busy machine is no stall: the training threads' wait for a core (``/proc/self/task/*/schedstat``) is
taken out of a step's time before it is judged; a sleep, a disk or a lock is no wait for a core."""

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

from hookscope.doctor.timing.cpu_wait import CpuWait
from hookscope.doctor.timing.phases import COLUMNS, DATA, WAIT
from hookscope.doctor.timing.stalls import StallDetector

pytestmark = pytest.mark.serial  # they measure time: run alone (`make test`'s second part)


needs_schedstat = pytest.mark.skipif(
    not os.path.exists("/proc/self/task") or not hasattr(os, "sched_setaffinity"),
    reason="Linux scheduler statistics and CPU affinity",
)


def busy(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


ALONE = """
import time
from hookscope.doctor.timing import cpu_wait

reads = []
read = cpu_wait._read
cpu_wait._read = lambda fd: (reads.append(fd), read(fd))[1]


def busy(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


wait = cpu_wait.CpuWait()
wait.choose()
busy(0.02)
wait.choose()  # the threads that computed since the first choice: this one alone
wait.take()
reads.clear()
waits = []
for _ in range(10):  # a step that only computes: off its core for well under 2% of its time
    busy(0.01)
    waits.append(wait.take())
computing = len(reads)
time.sleep(0.05)  # off the core, but waiting for no core
slept = wait.take()
print(wait.parallel, computing, waits.count(0.0), len(reads) - computing, slept)
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="Linux scheduler statistics")
def test_a_thread_that_stayed_on_its_core_reads_no_file_and_one_that_left_it_does():
    # a fresh process: the threads of earlier tests (writers, pools) would compute alongside this one
    done = subprocess.run([sys.executable, "-c", ALONE], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    parallel, computing, zeros, after_sleep, slept = done.stdout.split()
    assert parallel == "False"
    assert int(computing) <= 5 and int(zeros) >= 5  # read only where the machine took the core away
    assert int(after_sleep) == 1 and float(slept) < 0.5 * 0.05


@needs_schedstat
def test_sharing_one_core_with_a_busy_process_is_waiting_and_sleeping_is_not():
    wait = CpuWait()
    wait.choose()
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
    if shared < 0.4 / 0.8:  # it had its core to itself: affinity is not enforced (a sandbox)
        pytest.skip(f"the pinned thread ran {0.4 / shared:.0%} of the time: this kernel shares no core")
    assert waited > 0.25 * shared  # two busy threads on one core: each waits about half the time


WAITS = {"wait": 0.3, "busy machine": 0.12, "loop": 0.0, "loop, a little busy": 0.04}


def rows(n, stalled, where):
    """``n`` steps of 10 ms; the ``stalled`` ones 300 ms longer, the extra time in ``where`` (of which
    :data:`WAITS` seconds are the threads' wait for a core); on a busy machine every step waited."""
    table = np.zeros((n, len(COLUMNS)))
    table[:, DATA] = 0.010
    if where == "busy machine":
        table[:, DATA], table[:, WAIT] = 0.020, 0.008
    for i in stalled:
        table[i, DATA] += 0.3
        table[i, WAIT] += WAITS[where]
    return table


def test_a_step_the_machine_slowed_is_no_stall_and_one_the_loop_slowed_is():
    """The machine's step: its threads waited (``wait``), or every step waits for a core while an
    intra-op pool computes (their waits, each thread's own, no longer tell the machine's part); the
    loop's: a sleep, with or without a little wait, and any stall of one thread on a busy machine (its
    own time is exact)."""
    steps = np.arange(120)
    stalls = [30, 55, 80, 105]
    cases = (
        ("wait", False, []),
        ("busy machine", True, []),
        ("busy machine", False, stalls),
        ("loop", False, stalls),
        ("loop, a little busy", True, stalls),
    )
    for where, parallel, found in cases:
        detector = StallDetector()
        table = rows(120, stalls, where)
        for end in range(20, 121):
            detector.judge(steps[:end], table[:end], 1 if end > 20 else 20, {}, parallel=parallel)
        assert [s.step for s in detector.stalls] == found, (where, parallel)


@needs_schedstat
def test_it_tells_an_intra_op_pool_from_one_thread():
    x = torch.randn(400, 400)
    seen, before = {}, torch.get_num_threads()
    for threads in (1, 2):
        torch.set_num_threads(threads)
        wait = CpuWait()
        wait.choose()
        for _ in range(100):
            x @ x
        wait.choose()
        seen[threads] = wait.parallel
        wait.close()
    torch.set_num_threads(before)
    assert seen == {1: False, 2: True}


@needs_schedstat
def test_a_worker_thread_kept_from_its_core_is_the_steps_wait():
    """The training thread waits for its workers: a worker's wait for a core is the step's."""
    cores = os.sched_getaffinity(0)
    core = min(cores)
    started = threading.Event()

    def worker():
        os.sched_setaffinity(0, {core})  # this thread only
        started.set()
        busy(0.4)

    wait = CpuWait()
    wait.choose()  # the CPU each thread used so far (this process's earlier tests) counts for nothing
    thread = threading.Thread(target=worker)
    rival = subprocess.Popen(
        [sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{core}}})\nwhile True: pass"]
    )
    try:
        thread.start()
        started.wait()
        time.sleep(0.1)
        wait.choose()  # the worker has used the most CPU since: it is followed
        wait.take()
        start = time.perf_counter()
        thread.join()  # the training thread sleeps while the worker shares its core
        shared = time.perf_counter() - start
        waited = wait.take()
    finally:
        rival.kill()
        rival.wait()
        wait.close()
    if shared < 0.4 / 0.8:  # it had its core to itself: affinity is not enforced (a sandbox)
        pytest.skip(f"the pinned thread ran {0.4 / shared:.0%} of the time: this kernel shares no core")
    assert waited > 0.25 * shared
