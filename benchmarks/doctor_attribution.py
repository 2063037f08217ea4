"""Where ``Doctor()``'s time goes inside a real training step: the thread CPU time of each entry point.

The small CNN of ``doctor_overhead.py`` (1x28x28, batch 64, 300 steps, one thread) trains in the Learner
with ``Doctor()`` at its defaults, while every place where the Doctor's code runs is timed with
``time.thread_time``: its callback events and the guard's, the engine's feed calls, the hooks the protocol
and timing recorders put on the model's root and on a few parameters, the checks, and the memory probe's
reads. Each line is a *self* time: an entry point called from another timed one (the engine's calls from
the Doctor's events, the heap walk from the end of a batch) is counted in its own line only. The
recorded steps' statistics are not split out: they run inside the model's forward and backward.

Why not leave parts out and compare fits (``doctor_parts.py``)? On the CNN, two fits of the same variant
differ by more than the whole Doctor (the allocator's state, page faults); a thread-time split within one
fit does not. And why not a near-empty model? Inside a CNN's step each small device op the Doctor makes
costs 20-80 µs instead of the 3-11 µs of a tight loop (the step's kernels leave the caches cold), so the
split on a near-empty model understates the cost by about half. Wrapping costs ~1 µs per timed call
(about 25 a step).

    python benchmarks/doctor_attribution.py [--quick] [--rounds N]   # the last of N fits is reported
"""

from __future__ import annotations

import functools
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from common import benchmark_args
from doctor_overhead import fit, random_loaders
from stats_overhead import small_cnn

from hookscope.callbacks.doctor import Doctor
from hookscope.callbacks.guard import NonFiniteGuard
from hookscope.doctor.engine import Engine
from hookscope.doctor.protocol.gradients import StaleGradients
from hookscope.doctor.protocol.recorder import ProtocolRecorder
from hookscope.doctor.timing.memory import _InUse
from hookscope.doctor.timing.recorder import TimingRecorder

ENTRY_POINTS: list[tuple[type, str]] = [
    *(
        (Doctor, event)
        for event in ("before_batch", "after_loss", "before_step", "after_step", "after_batch")
    ),
    *((NonFiniteGuard, event) for event in ("before_batch", "after_loss", "before_step")),
    *(
        (Engine, call)
        for call in (
            "begin_batch",
            "log_target",
            "log_loss",
            "gradients_ready",
            "step_done",
            "end_batch",
            "check",
        )
    ),
    (ProtocolRecorder, "_before_forward"),
    (ProtocolRecorder, "_after_forward"),
    (TimingRecorder, "_forward_starts"),
    (TimingRecorder, "_forward_ends"),
    (TimingRecorder, "end_batch"),
    (_InUse, "__call__"),  # the memory probe's read: statm and the heap walk
]


class SelfTimes:
    """Thread CPU seconds and calls per label, each less the time of the timed calls made inside it."""

    def __init__(self) -> None:
        self.seconds: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self._inner: list[float] = []

    def timed(self, label: str, function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def run(*args: Any, **kwargs: Any) -> Any:
            start = time.thread_time()
            self._inner.append(0.0)
            try:
                return function(*args, **kwargs)
            finally:
                inner, spent = self._inner.pop(), time.thread_time() - start
                self.seconds[label] += spent - inner
                self.calls[label] += 1
                if self._inner:
                    self._inner[-1] += spent

        return run

    def instrument(self) -> None:
        """Wrap every entry point (at class level: the hooks registered at attach are the wrapped ones)."""
        for owner, name in ENTRY_POINTS:
            setattr(owner, name, self.timed(f"{owner.__name__}.{name}", getattr(owner, name)))
        for name in ("_arriving", "_arrived"):  # the stale-gradient hooks, made per watched parameter
            make, label = getattr(StaleGradients, name), f"stale.{name}"
            timed = lambda watched, make=make, label=label: self.timed(label, make(watched))  # noqa: E731
            setattr(StaleGradients, name, staticmethod(timed))

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()


def main() -> None:
    args = benchmark_args(__doc__.splitlines()[0])
    torch.set_num_threads(1)
    steps_per_epoch, epochs, rounds = (10, 2, 1) if args.quick else (100, 3, args.rounds)
    steps = steps_per_epoch * epochs
    times = SelfTimes()
    times.instrument()
    loaders = random_loaders(steps_per_epoch, 64, (1, 28, 28))
    for _ in range(rounds):  # the earlier fits warm the process up, as in the other benchmarks
        times.reset()
        seconds = fit(small_cnn, loaders, epochs, time.thread_time, {}) * steps  # doctor_overhead's fit
    print(f"Doctor() per step, by entry point: small CNN, batch 64, {steps} steps, fit {rounds} of {rounds}")
    print(f"  whole step (thread CPU time)            {seconds / steps * 1e6:9.1f} µs")
    for label, spent in times.seconds.most_common():
        calls = times.calls[label]
        each = spent / calls * 1e6
        print(f"  {label:<38}{spent / steps * 1e6:9.1f} µs/step  ({calls} calls, {each:.1f} µs each)")
    total = sum(times.seconds.values())
    share = total / seconds
    print(
        f"  {'the Doctor, all entry points':<38}{total / steps * 1e6:9.1f} µs/step = {share:.1%} of the fit"
    )


if __name__ == "__main__":
    main()
