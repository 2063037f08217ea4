"""The memory probe reads the process's resident memory as it grows, and knows the machine's total;
the collector's time is read from gc.callbacks."""

import gc

import numpy as np
import torch

from hookscope.doctor.timing.gc_time import GcTime
from hookscope.doctor.timing.memory import MemoryProbe


def test_the_probe_follows_the_resident_memory():
    probe = MemoryProbe(torch.device("cpu"))
    before = probe.read()
    kept = np.full(64 << 17, 1.0)  # 64 MB, every page touched
    after = probe.read()
    probe.close()
    assert 60 << 20 <= after - before <= 72 << 20
    assert probe.total > after
    assert kept.sum() > 0


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
