"""The memory probe reads the process's resident memory as it grows, and knows the machine's total;
its cadence reads it less often while a read is slow; the collector's time is read from gc.callbacks."""

import gc
import mmap
import platform
import subprocess
import sys

import numpy as np
import pytest
import torch

from hookscope.doctor.timing.gc_time import GcTime
from hookscope.doctor.timing.memory import AFTERMATH, BUDGET, DENSE, MAX_FACTOR, MemoryCadence, MemoryProbe

pytestmark = pytest.mark.serial  # they measure time: run alone (`make test`'s second part)


def test_the_probe_follows_the_resident_memory():
    probe = MemoryProbe(torch.device("cpu"))
    before = probe.read()
    # 64 MB of fresh pages, every one touched: memory an earlier test freed cannot stand in for them
    kept = mmap.mmap(-1, 64 << 20)
    np.frombuffer(kept, dtype=np.uint8)[:: mmap.PAGESIZE] = 1
    after = probe.read()
    probe.close()
    assert 60 << 20 <= after - before <= 72 << 20
    assert probe.total > after
    kept.close()


UNTOUCHED = """
import numpy as np
from hookscope.doctor.timing import keep_freed_memory
from hookscope.doctor.timing.memory import MemoryProbe
import torch

keep_freed_memory()  # freed blocks of up to 32 MB stay in the heap, as free chunks
probe = MemoryProbe(torch.device("cpu"))
blocks = [np.zeros(2_000_000) for _ in range(100)]  # 1.6 GB of calloc, never written: not resident
del blocks
info = probe.read.mallinfo2()
print(probe.read(), info.uordblks + info.hblkhd, info.fordblks)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallinfo2")
def test_memory_in_use_is_never_less_than_what_malloc_handed_out():
    out = subprocess.run([sys.executable, "-c", UNTOUCHED], capture_output=True, text=True, check=True)
    in_use, handed_out, free = map(int, out.stdout.split())
    assert free > 256 << 20  # the freed blocks are free chunks, which were never resident
    assert in_use >= handed_out > 0


def test_the_collectors_time_is_counted_between_takes():
    clock = GcTime()
    clock.start()
    clock.take()
    for _ in range(100_000):
        cycle = []
        cycle.append(cycle)
    gc.collect()
    seconds = clock.take()
    clock.stop()
    gc.collect()
    assert seconds > 0 and clock.take() == 0.0


# ---- the cadence of the reads ----------------------------------------------------------------------------


def read_steps(cadence, steps, cost, between, start=0):
    """The steps a cadence reads from ``start`` up to ``steps``, each read taking ``cost`` seconds and each
    step ``between`` seconds (a clock of our own)."""
    now, read = 0.0, []
    for step in range(start, steps):
        if cadence.due(step):
            read.append(step)
            cadence.read(step, now, now + cost)
            now += cost
        now += between
    return read


def test_the_first_samples_come_every_4th_step_however_slow_the_read():
    cadence = MemoryCadence(4, adaptive=True)
    read = read_steps(cadence, 4 * DENSE, cost=0.01, between=0.001)
    assert read == list(range(0, 4 * DENSE, 4))


def test_the_dense_samples_are_those_the_rule_reads_after_the_warm_up():
    """memory_growth reads no sample of the warm-up: its first verdict needs DENSE samples after it."""
    cadence = MemoryCadence(4, adaptive=True, warmup=10)
    read = read_steps(cadence, 200, cost=0.01, between=0.001)
    after = [step for step in read if step >= 10]
    assert read[:3] == [0, 4, 8] and after[:DENSE] == list(range(12, 12 + 4 * DENSE, 4))
    assert after[DENSE + 1] - after[DENSE] == 8  # then the slow read doubles the interval


def test_a_resumed_process_samples_densely_again_after_its_own_warm_up():
    cadence = MemoryCadence(4, adaptive=True, warmup=10)
    read_steps(cadence, 500, cost=0.01, between=0.001)
    assert cadence.every == 4 * MAX_FACTOR  # the slow reads had spread the samples out
    cadence.restart(600, warmup=610)  # resumed at step 600
    read = read_steps(cadence, 900, cost=0.01, between=0.001, start=600)
    after = [step for step in read if step >= 610]
    assert read[:3] == [600, 604, 608] and after[:DENSE] == list(range(612, 612 + 4 * DENSE, 4))


def test_a_slow_read_then_doubles_the_interval_up_to_16_times():
    cadence = MemoryCadence(4, adaptive=True)
    read = read_steps(cadence, 4000, cost=0.01, between=0.001)
    gaps = np.diff(read[DENSE:]).tolist()  # from the first read past the dense ones
    assert gaps[:5] == [8, 16, 32, 64, 64] and set(gaps[5:]) == {64}
    assert cadence.every == 4 * MAX_FACTOR


def test_a_read_that_turns_cheap_brings_the_interval_back():
    cadence = MemoryCadence(4, adaptive=True)
    read_steps(cadence, 2000, cost=0.01, between=0.001)
    # a read of 1 µs between steps of 10 ms: far under a quarter of the budget
    read = read_steps(cadence, 4000, cost=1e-6, between=0.01)
    assert cadence.every == 4 and np.diff(read[-10:]).tolist() == [4] * 9


def test_a_cheap_read_keeps_the_base_interval():
    cadence = MemoryCadence(4, adaptive=True)
    cost = BUDGET * 4 * 0.01 / 2 / AFTERMATH  # half the budget of the 4 steps of 10 ms between two reads
    read = read_steps(cadence, 1000, cost=cost, between=0.01)
    assert read == list(range(0, 1000, 4))


def test_a_read_is_weighed_with_what_it_costs_the_steps_after_it():
    """A heap walk of 20 us every 4th step of 10 ms is 0.05% of the time by its own clock, 0.3% with the
    caches it empties: over the budget, so the interval grows."""
    cadence = MemoryCadence(4, adaptive=True)
    read = read_steps(cadence, 1000, cost=20e-6, between=0.01)
    assert read[: DENSE + 1] == list(range(0, 4 * DENSE + 4, 4)) and cadence.every > 4


def test_an_interval_the_user_chose_is_kept():
    cadence = MemoryCadence(3, adaptive=False)
    read = read_steps(cadence, 600, cost=0.01, between=0.0001)
    assert read == list(range(0, 600, 3))
