"""memory_growth: a loop that keeps a new 2 MB buffer every step is found with its rate; memory that
rises once (a cache) and stays flat is not."""

import numpy as np
from timing_loops import Leak, in_memory, run

from hookscope.doctor.timing.memory_growth import growth_start, memory_growth, robust_slope

MB = 1 << 20


def test_a_leak_of_2_mb_per_step_is_found_with_its_rate():
    leak = Leak(mb=2.0)
    found = {f.kind: f for f in run(in_memory(), 120, on_forward=leak).close()}
    assert set(found) == {"memory_growth"}
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


def test_a_sawtooth_whose_every_run_climbs_but_the_whole_does_not_is_no_growth():
    """Each run of samples rises (a buffer filling), then a release falls below where it began."""
    from hookscope.doctor.timing.memory_growth import SEGMENT, SEGMENTS, memory_growth

    runs = SEGMENTS + 2
    steps = np.arange(runs * SEGMENT) * 4
    values = np.concatenate([400e6 - 4e6 * r + np.arange(SEGMENT) * 4e5 for r in range(runs)])
    assert memory_growth(steps, values, "process memory", "the machine's", 2**34) is None
    climbing = 400e6 + np.arange(runs * SEGMENT) * 4e5
    assert memory_growth(steps, climbing, "process memory", "the machine's", 2**34) is not None
