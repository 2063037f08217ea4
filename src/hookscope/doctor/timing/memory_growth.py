"""``memory_growth``: memory that climbs step after step, the rate, since when, and when it runs out.

Read from the recent memory samples (after the warm-up). The last :data:`SEGMENTS` x :data:`SEGMENT`
samples are cut into :data:`SEGMENTS` runs; memory grows when *each* run rises, by its robust slope
(Theil-Sen: the median of the slopes between every two samples), by more than :data:`NOISE` times its
scatter around that slope and by at least :data:`MIN_RISE`. A rise that happens once (a cache filling, a
buffer made at the first validation) lies inside one run, so the others stay flat and nothing is said;
a leak rises in all of them. Walking back run by run while they rise too gives when the growth started;
the rate is the robust slope since then, and the device's or machine's total at that rate tells when it
would run out.
"""

from __future__ import annotations

import numpy as np

from hookscope.doctor.findings import Finding

SEGMENT = 6
SEGMENTS = 3
NOISE = 3.0
MIN_RISE = 1 << 20  # bytes per run
FIT = 128  # samples the rate is fitted on, at most


def robust_slope(steps: np.ndarray, values: np.ndarray) -> float:
    """Theil-Sen: the median of the slopes between every two samples (per step)."""
    i, j = np.triu_indices(len(steps), k=1)
    dx = (steps[j] - steps[i]).astype(float)
    keep = dx > 0
    if not keep.any():
        return 0.0
    return float(np.median((values[j] - values[i])[keep] / dx[keep]))


def _rises(steps: np.ndarray, values: np.ndarray) -> bool:
    slope = robust_slope(steps, values)
    residual = values - slope * steps
    scatter = 1.4826 * float(np.median(np.abs(residual - np.median(residual))))
    rise = slope * float(steps[-1] - steps[0])
    return rise >= max(NOISE * scatter, MIN_RISE)


def growth_start(steps: np.ndarray, values: np.ndarray) -> int | None:
    """Index of the first sample of the growth that goes on to the last sample (None: no growth)."""
    n = len(steps)
    if n < SEGMENT * SEGMENTS:
        return None
    start = n
    for _ in range(SEGMENTS):
        start -= SEGMENT
        if not _rises(steps[start : start + SEGMENT], values[start : start + SEGMENT]):
            return None
    while start - SEGMENT >= 0 and _rises(steps[start - SEGMENT : start], values[start - SEGMENT : start]):
        start -= SEGMENT
    return start


def memory_growth(steps: np.ndarray, values: np.ndarray, what: str, where: str, total: int) -> Finding | None:
    """The finding when the memory samples ``(steps, values)`` have grown in every recent run."""
    start = growth_start(steps, values)
    # every recent run rises, and so must the whole: a sawtooth (each run climbing, a release between
    # them, as the allocator trims) stays where it was
    if start is None or not _rises(steps[start:], values[start:]):
        return None
    clear = _clear_at(steps, values, start)
    fit = slice(max(start, len(steps) - FIT), len(steps))
    rate = robust_slope(steps[fit], values[fit])
    since, now, last = int(steps[start]), float(values[-1]), int(steps[-1])
    message = (
        f"{what} grew by {_size(rate)} per step since step {since} (from {_size(values[start])} to "
        f"{_size(now)} at step {last}): something keeps memory every step — a list of losses or "
        "outputs kept as tensors with their graphs (keep loss.item() or .detach() them), a cache "
        "without a bound, a history growing in a callback."
    )
    evidence = {"bytes_per_step": round(rate, 1), "since": since, "bytes": int(now), "total": int(total)}
    if total > now and rate > 0:
        reach = last + int((total - now) / rate)
        message += f" At this rate it reaches {where} {_size(total)} around step {reach:,}."
        evidence["runs_out_at"] = reach
    return Finding("memory_growth", "", clear, "warning", message, evidence)


def _clear_at(steps: np.ndarray, values: np.ndarray, start: int) -> int:
    """The step of the first sample at which the growth since ``start`` was already found (the rules
    run now and then: the finding is named by the step it became clear at). ``start`` is found in runs
    counted from the last sample, so the same growth seen from an earlier sample may start up to a run
    before it."""
    for end in range(max(SEGMENT * SEGMENTS, start + SEGMENT * (SEGMENTS - 1) + 1), len(steps)):
        earlier = growth_start(steps[:end], values[:end])
        if earlier is not None and earlier > start - SEGMENT:
            return int(steps[end - 1])
    return int(steps[-1])


def _size(n: float) -> str:
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"
