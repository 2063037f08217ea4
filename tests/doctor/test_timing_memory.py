"""The memory probe reads the process's resident memory as it grows, and knows the machine's total;
the collector's time is read from gc.callbacks."""

import gc
import mmap

import numpy as np
import torch

from hookscope.doctor.timing.gc_time import GcTime
from hookscope.doctor.timing.memory import MemoryProbe


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
