"""Steps slow for no other reason: the steps' own compute grew since the start of the run.

:class:`Slowdown` takes the median compute time — forward, backward and optimizer, less the time the
threads waited for a core — of the first :data:`REFERENCE` steps after the warm-up as the run's
reference. At each run of the rules it compares the median of the last :data:`LATEST` steps: once that
is :data:`FACTOR` times the reference or more, and at least :data:`MIN_GROWTH` longer, the steps are
slower than the run's own start, and neither the loader (``data`` is not compute), a stall (one step
does not move a median), a busy machine (its wait is taken out; while an intra-op pool computes, whose
threads' waits tell the machine's part less exactly, nothing is judged while the latest steps wait for
a core :data:`~.stalls.BUSY` of their time or more) nor the allocator (on the CPU, what the kernel's
time beyond the data phase grew since the reference is taken out: a process whose malloc starts giving
memory back to the system faults every step from then on, in every layer alike, see
:mod:`~.page_faults`) is the reason. Seen at two checks whose latest steps do not overlap (a growth
that lasts, not a spell of a busy machine), the recorder profiles a short window once
(:mod:`~.slow_layers`), whose finding says what grew and names the modules that take the time now: a
cache or a history that a layer attends over and that grows every step, a graph walked through ever more
steps, a sequence length that grows. Before the window reports, the growth
is timed again (:meth:`Slowdown.holds`): in the profiled steps and in the :data:`AFTER` unprofiled steps
that follow them, measured as the reference was. Where either is fast again, the slowdown ended by itself
(another process on a shared core or its caches: on a virtual machine that takes no wait for a core the
threads can see) and the window reports nothing; a run that ends before those steps are read gets no
finding from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hookscope.doctor.timing.phases import DATA, FORWARD, OPTIMIZER, WAIT
from hookscope.doctor.timing.stalls import machine_busy

REFERENCE = 32  # steps after the warm-up: the run's own reference
LATEST = 32  # the latest steps compared with it
FACTOR = 1.5
MIN_GROWTH = 2e-3  # seconds per step: a smaller growth is not worth a profile
AFTER = 32  # unprofiled steps after the window that must still show the growth


@dataclass(frozen=True)
class Growth:
    """The steps' compute grew from ``before`` seconds (steps ``first``-``last`` of the reference) to
    ``now`` (the latest steps, up to ``seen``)."""

    first: int
    last: int
    before: float
    now: float
    seen: int

    def describe(self) -> str:
        return (
            f"The steps' forward, backward and optimizer grew from {self.before * 1e3:.1f} ms (steps "
            f"{self.first}-{self.last}) to {self.now * 1e3:.1f} ms ({self.now / self.before:.1f}x, by step "
            f"{self.seen}), with nothing else to explain it: profiled to see where the time goes now. "
        )


class Slowdown:
    """The run's reference compute time, and the growth found (once)."""

    def __init__(self) -> None:
        # first step, last step, median compute seconds, median kernel seconds beyond the data phase
        self.reference: tuple[int, int, float, float] | None = None
        self.growth: Growth | None = None
        self.suspected: int | None = None  # the last step of the latest steps that first showed it

    def check(
        self, steps: np.ndarray, rows: np.ndarray, parallel: bool = False, kernel: np.ndarray | None = None
    ) -> Growth | None:
        """The growth when the latest of the recent ``steps``/``rows`` (after the warm-up) show it, as did
        the latest steps of an earlier check that they do not overlap: a growth that lasts. ``parallel``:
        other threads compute with the training thread; ``kernel``: the process's kernel seconds in each
        step, where they were counted."""
        if self.growth is not None or len(steps) < REFERENCE:
            return None
        compute, faults = _compute(rows, kernel)
        if self.reference is None:
            window = slice(0, REFERENCE)
            before, before_faults = float(np.median(compute[window])), float(np.median(faults[window]))
            self.reference = (int(steps[0]), int(steps[REFERENCE - 1]), before, before_faults)
        first, last, before, before_faults = self.reference
        if steps[-LATEST] <= last:
            return None
        now = _now(compute[-LATEST:], faults[-LATEST:], before_faults)
        if not _grown(before, now) or (parallel and machine_busy(rows[-LATEST:])):
            self.suspected = None
            return None
        if self.suspected is None:
            self.suspected = int(steps[-1])
        if steps[-LATEST] <= self.suspected:
            return None
        self.growth = Growth(first, last, before, now, int(steps[-1]))
        return self.growth

    def holds(
        self, steps: np.ndarray, rows: np.ndarray, profiled: list[int], kernel: np.ndarray | None = None
    ) -> bool | None:
        """Whether the growth still holds in the ``profiled`` steps and in the :data:`AFTER` steps that
        follow them; None while some of those are not among the recent ``steps``/``rows``. The profiler
        only adds time, so profiled steps that are fast again were slowed by something that ended; the
        steps after the window are timed as the reference was, without the profiler's own overhead
        (which a slower machine makes larger), so they tell it apart from a growth that is still there.
        Either fast again: another process on the machine's shared core or caches, which the threads'
        wait for a core does not show — not the layers."""
        if self.reference is None or not profiled:
            return None
        during = np.flatnonzero(np.isin(steps, profiled))
        after = np.flatnonzero(steps > max(profiled))[:AFTER]
        if len(during) < len(profiled) or len(after) < AFTER:
            return None
        _, _, before, before_faults = self.reference
        return all(
            _grown(before, _now(*_compute(rows[i], kernel[i] if kernel is not None else None), before_faults))
            for i in (during, after)
        )

    def state_dict(self) -> dict[str, Any]:
        growth = self.growth
        return {
            "reference": list(self.reference) if self.reference is not None else None,
            "growth": list(growth.__dict__.values()) if growth is not None else None,
            "suspected": self.suspected,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        reference, growth = state.get("reference"), state.get("growth")
        if reference:  # older checkpoints kept no kernel time: none counted then
            kept = float(reference[3]) if len(reference) > 3 else 0.0
            self.reference = (int(reference[0]), int(reference[1]), float(reference[2]), kept)
        else:
            self.reference = None
        self.growth = Growth(*growth) if growth else None
        self.suspected = state.get("suspected")


def _compute(rows: np.ndarray, kernel: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Each step's compute seconds (forward, backward and optimizer less the wait for a core), and the
    kernel's seconds that the loader's reads cannot explain (page faults in the compute)."""
    compute = np.maximum(rows[:, FORWARD : OPTIMIZER + 1].sum(axis=1) - rows[:, WAIT], 0.0)
    faults = np.maximum(kernel - rows[:, DATA], 0.0) if kernel is not None else np.zeros(len(rows))
    return compute, faults


def _now(compute: np.ndarray, faults: np.ndarray, before_faults: float) -> float:
    """The median compute, less what the faults grew by since the reference: that is the allocator's,
    not the layers' (a level they kept all along is left in, so the factor is judged against the whole
    compute of the start)."""
    return float(np.median(compute)) - max(float(np.median(faults)) - before_faults, 0.0)


def _grown(before: float, now: float) -> bool:
    return now >= FACTOR * before and now - before >= MIN_GROWTH
