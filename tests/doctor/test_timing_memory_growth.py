"""memory_growth: a loop that keeps a new 2 MB buffer every step is found with its rate; memory that
rises once (a cache) and stays flat is not."""

import time

import numpy as np
import pytest
from timing_loops import Leak, collect_earlier_garbage, in_memory, run
from torch import nn

from hookscope.doctor.timing import TimingRecorder
from hookscope.doctor.timing.memory_growth import growth_start, memory_growth, robust_slope

pytestmark = pytest.mark.serial  # they measure time: run alone (`make test`'s second part)

MB = 1 << 20


def test_a_leak_of_2_mb_per_step_is_found_with_its_rate():
    leak = Leak(mb=2.0)
    collect_earlier_garbage()
    leak.back(120)
    found = {f.kind: f for f in run(in_memory(), 120, on_forward=leak).close()}
    assert set(found) - {"slow_layers"} == {"memory_growth"}
    assert "slow_layers" not in found or leak.grew()  # only where the machine made the leak itself slower
    finding = found["memory_growth"]
    assert 1.6 * MB <= finding.evidence["bytes_per_step"] <= 2.4 * MB
    assert finding.evidence["since"] <= 40
    assert finding.step <= 100  # clear after the warm-up and three runs of samples
    assert finding.evidence["runs_out_at"] > finding.step
    assert "per step since step" in finding.message and "resident memory" in finding.message


def test_memory_that_rises_once_is_silent():
    cache = Leak(mb=64.0, start=40, once=True)
    assert run(in_memory(), 120, on_forward=cache).close() == []
    assert len(cache.kept) == 1


def test_growth_needs_every_recent_run_to_rise():
    steps = np.arange(0, 200, 4)
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 0.3 * MB, len(steps))
    leak = 500 * MB + 2 * MB * steps + noise
    assert abs(robust_slope(steps, leak) - 2 * MB) < 0.05 * MB
    assert growth_start(steps, leak) == 2  # every run rises: back to the start, in runs of 6 samples
    jump = 500 * MB + 64 * MB * (steps >= 100) + noise
    assert growth_start(steps, jump) is None
    flat = 500 * MB + noise
    assert growth_start(steps, flat) is None
    late = 500 * MB + 2 * MB * np.maximum(steps - 100, 0) + noise
    assert steps[growth_start(steps, late)] >= 92
    finding = memory_growth(steps, late, "memory", "the device's", total=8 << 30)
    assert finding.evidence["runs_out_at"] == steps[-1] + int(
        (8 * 1024 * MB - late[-1]) / finding.evidence["bytes_per_step"]
    )


def test_a_growth_is_named_by_the_sample_it_became_clear_at_though_later_samples_are_sparse():
    """The memory cadence thins the reads after the dense ones: the growth was clear at the 18th."""
    steps = np.array([*range(12, 84, 4), 84, 92, 100, 108])
    noise = np.random.default_rng(0).normal(0, 0.1 * MB, len(steps))
    finding = memory_growth(steps, 500 * MB + 2 * MB * steps + noise, "memory", "the device's", 8 << 30)
    assert finding.step == 80 and finding.evidence["since"] <= 28


def test_a_sawtooth_whose_every_run_climbs_but_the_whole_does_not_is_no_growth():
    """Each run of samples rises (a buffer filling), then a release falls below where it began."""
    from hookscope.doctor.timing.memory_growth import SEGMENT, SEGMENTS, memory_growth

    runs = SEGMENTS + 2
    steps = np.arange(runs * SEGMENT) * 4
    values = np.concatenate([400e6 - 4e6 * r + np.arange(SEGMENT) * 4e5 for r in range(runs)])
    assert memory_growth(steps, values, "process memory", "the machine's", 2**34) is None
    climbing = 400e6 + np.arange(runs * SEGMENT) * 4e5
    assert memory_growth(steps, climbing, "process memory", "the machine's", 2**34) is not None


class SlowProbe:
    """A memory probe whose read takes 2 ms (a long heap walk) and sees ``used(step)`` bytes."""

    what, where, total = "the process's resident memory in use", "the machine's", 1 << 40

    def __init__(self, used):
        self.used, self.step, self.steps_read = used, 0, []

    def read(self):
        time.sleep(0.002)
        self.steps_read.append(self.step)
        return self.used(self.step)

    def close(self):
        pass


def test_a_leak_that_starts_late_is_found_while_slow_reads_are_spread_out():
    recorder = TimingRecorder()
    recorder.attach(nn.Linear(2, 2))
    probe = recorder.memory = SlowProbe(lambda step: (1 << 30) + max(0, step - 600) * MB)
    found = []
    for step in range(2200):
        probe.step = step
        recorder.begin_batch(step, training=True)
        recorder.gradients_ready()
        recorder.step_done()
        recorder.end_batch()
        if step % 10 == 9:
            found += recorder.findings()
    recorder.close()
    growth = {f.kind: f for f in found + recorder.findings()}["memory_growth"]
    assert np.diff(probe.steps_read[-5:]).tolist() == [64] * 4  # 2 ms reads between ~0 ms steps
    assert len(probe.steps_read) < 80  # instead of 550 at every 4th step
    # the start is as exact as the samples are dense: within a run of 6 samples 64 steps apart
    assert 600 - 6 * 64 <= growth.evidence["since"] <= 700 and growth.step <= 600 + 20 * 64
    assert 0.9 * MB <= growth.evidence["bytes_per_step"] <= 1.1 * MB
