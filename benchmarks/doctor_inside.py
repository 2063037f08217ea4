"""Where ``Doctor()``'s own time goes inside a training step: microseconds per step in each of its parts.

``doctor_overhead.py`` times whole fits against the bare Learner; on a shared 2-core VM the spread between
two identical variants reaches 3% (docs/benchmarks.md, stop 40), so a change worth half a percent does
not show there. This script times the Doctor from the inside instead: each event handler of the Doctor
and of its guard, the root-module hooks of its protocol and timing recorders, the memory read and the
guard's decision are wrapped with ``time.perf_counter`` on their classes, and one 300-step fit of the
small CNN of ``doctor_overhead.py`` (three epochs, a validation batch each) runs ``--rounds`` times.

Five tables: per *plain* step (neither recorded nor checked: past the warm-up of 10, not a 50th step or
the one after, not the end of a check interval or an epoch), the microseconds inside each part, the
wrapped calls nested in another listed under it; the same total for the plain steps the protocol recorder
looks at (its device checks and parameter hooks: every step of the first 32, then 4 in every 32 and 4
after each validation, :mod:`hookscope.doctor.protocol.looks`) and for those it does not; per recorded
step after the warm-up (every 50th: the statistics recorders switch their hooks on, take each watched
layer's output and output gradient, the parameters' gradient norms and update ratios, and switch the hooks
off); per check (the rules at the warm-up's end, step 4, then every ``CHECK_EVERY`` = 20 steps; those
after a recorded step and the last one left out: they read the statistics), the microseconds inside each
part of a check; and every check of a fit by kind — the first (it reads the 5 records of the warm-up,
steps 0-4), those after a recorded step (they read its statistics and run the
record rules again), the plain ones and the last one (at the end of the fit) — in milliseconds a check
and a fit. The timing recorder's rules run at the first check after every 50 steps, of either kind.

These are the Doctor's own times on caches the step's kernels left cold (a small op costs 20-80 µs
there, a Python call about 1-2 µs), not what the step loses in all: the hooks' dispatch by torch and what
the Doctor evicts from the caches are not in them. Rounds run in one process: the memory read's heap walk
lengthens from fit to fit (``mallinfo2``, see hookscope/doctor/timing/memory.py), as in
``doctor_overhead.py``.

    python benchmarks/doctor_inside.py [--rounds 4]
"""

from __future__ import annotations

import functools
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import torch
from common import benchmark_args
from doctor_overhead import random_loaders
from stats_overhead import small_cnn
from torch import nn

import hookscope as hs
from hookscope.callbacks.doctor import Doctor
from hookscope.callbacks.guard import NonFiniteGuard
from hookscope.doctor.engine import CHECK_EVERY, Engine
from hookscope.doctor.guard import BatchJournal, NonFiniteCheck
from hookscope.doctor.protocol.looks import Looks
from hookscope.doctor.protocol.recorder import ProtocolRecorder
from hookscope.doctor.recorders import ActivationRecorder, GradientRecorder
from hookscope.doctor.timing import memory
from hookscope.doctor.timing.recorder import TimingRecorder
from hookscope.train.callback import Callback

STEPS, EPOCHS, RECORD_EVERY, WARMUP = 300, 3, 50, 5

# (class, method, the part it sits in: None for a step's top level) for the tables of a step
STEP_PARTS: list[tuple[type, str, str | None]] = [
    *(
        (Doctor, event, None)
        for event in ("before_batch", "after_loss", "before_step", "after_step", "after_batch")
    ),
    *((NonFiniteGuard, event, None) for event in ("before_batch", "after_loss", "before_step")),
    (ProtocolRecorder, "_before_forward", None),
    (ProtocolRecorder, "_after_forward", None),
    (TimingRecorder, "_forward_starts", None),
    (TimingRecorder, "_forward_ends", None),
    (BatchJournal, "record", "NonFiniteGuard.before_batch"),
    (NonFiniteCheck, "decide", "NonFiniteGuard.before_step"),
    (ProtocolRecorder, "begin_batch", "Doctor.before_batch"),
    (ProtocolRecorder, "step_done", "Doctor.after_step"),
    (TimingRecorder, "end_batch", "Doctor.after_batch"),
    (memory._InUse, "__call__", "TimingRecorder.end_batch"),
    # what a recorded step adds (nothing on a plain step: the engine does not call them then)
    (ActivationRecorder, "begin_batch", "Doctor.before_batch"),
    (GradientRecorder, "begin_batch", "Doctor.before_batch"),
    (GradientRecorder, "gradients_ready", "Doctor.before_step"),
    (GradientRecorder, "step_done", "Doctor.after_step"),
    (ActivationRecorder, "end_batch", "Doctor.after_batch"),
    (GradientRecorder, "end_batch", "Doctor.after_batch"),
]
HOOKS = {ActivationRecorder: "ActivationRecorder's hooks", GradientRecorder: "GradientRecorder's hooks"}
CHECK_PARTS: list[tuple[type, str, str | None]] = [
    (Engine, "check", None),
    (Engine, "read_pending", "Engine.check"),
    (TimingRecorder, "flush", "Engine.read_pending"),
    (Engine, "_read_own", "Engine.read_pending"),
    (Engine, "diagnose", "Engine.check"),
    (Engine, "_stalled", "Engine.diagnose"),
    (ProtocolRecorder, "findings", "Engine.diagnose"),
    (TimingRecorder, "findings", "Engine.diagnose"),
]


def checked(step: int) -> bool:
    """The rules run at the end of ``step``: the warm-up's last step, then every ``CHECK_EVERY``."""
    return step >= WARMUP - 1 and (step - WARMUP + 1) % CHECK_EVERY == 0


def plain(step: int) -> bool:
    """Neither recorded (the warm-up, every 50th step) nor checked, and not next to either."""
    return (
        step > WARMUP + 2
        and step % RECORD_EVERY not in (0, 1)
        and not checked(step)
        and step % (STEPS // EPOCHS) not in (0, STEPS // EPOCHS - 1)
    )


def after_record(step: int) -> bool:
    """The check ending ``step`` is the first after a recorded step past the warm-up."""
    return any(r >= RECORD_EVERY and r % RECORD_EVERY == 0 for r in range(step - CHECK_EVERY + 1, step + 1))


def check_kind(step: int) -> str:
    """Which kind of check ends ``step`` (see the module's docstring)."""
    if step == WARMUP - 1:
        return "first (reads the warm-up's records)"
    if step == STEPS - 1:
        return "last (at the fit's end)"
    if after_record(step):
        return "after a recorded step"
    return "plain"


def step_kind(step: int) -> str | None:
    """The step's kind: "plain" (see :func:`plain`), "recorded" (a recorded step after the warm-up: every
    50th) or None."""
    if plain(step):
        return "plain"
    return "recorded" if step >= RECORD_EVERY and step % RECORD_EVERY == 0 else None


def plain_check(step: int) -> bool:
    """A check that reads no new statistics: not the first, not right after a recorded step, not the last."""
    return step > WARMUP and not after_record(step) and step != STEPS - 1


class Timer:
    """Seconds inside each wrapped method, per bucket: ``bucket(step)`` names the bucket of the current
    step (None: not counted); ``per_step``: the seconds of the top-level methods (``top=True``), per
    step. One wrapper per method, whatever the buckets: a wrapper inside another would be timed too."""

    def __init__(self, bucket: Callable[[int], str | None]) -> None:
        self.seconds: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.per_step: dict[int, float] = defaultdict(float)
        self.step = -1
        self.bucket = bucket

    def wrap(self, cls: type, name: str, top: bool = False) -> None:
        method = getattr(cls, name)
        setattr(cls, name, functools.wraps(method)(self.timed(method, f"{cls.__name__}.{name}", top)))

    def wrap_hooks(self, cls: type, label: str) -> None:
        """Time the hooks that ``cls._hook(name)`` makes, all under ``label`` (top-level)."""
        make = cls._hook
        cls._hook = lambda recorder, name: self.timed(make(recorder, name), label, True)

    def timed(self, fn: Callable[..., Any], label: str, top: bool) -> Callable[..., Any]:
        """``fn``, its seconds added under ``label`` to the current step's bucket (if any)."""

        def timed(*args: Any, **kwargs: Any) -> Any:
            bucket = self.bucket(self.step)
            if bucket is None:
                return fn(*args, **kwargs)
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(bucket, label, time.perf_counter() - start, top)

        return timed

    def add(self, bucket: str, label: str, seconds: float, top: bool) -> None:
        self.seconds[bucket][label] += seconds
        if top:
            self.per_step[self.step] += seconds


class Steps(Callback):
    """Tells the timers which training step runs (first in every event)."""

    order = -1000

    def __init__(self, *timers: Timer) -> None:
        self.timers = timers

    def before_batch(self) -> None:
        if self.learn.training:
            for timer in self.timers:
                timer.step = self.learn.training_step


class Watched:
    """The training steps the protocol recorder looks at, as its :class:`Looks` decides them."""

    def __init__(self) -> None:
        self.steps: set[int] = set()
        decide = Looks.begin_batch

        def begin_batch(looks: Looks, step: int, training: bool) -> None:
            decide(looks, step, training)
            if training and looks.watching:
                self.steps.add(step)

        Looks.begin_batch = begin_batch  # type: ignore[method-assign]


def time_checks(seconds: dict[str, float], calls: Counter[str], steps: Timer) -> None:
    """Wrap ``Engine.check``: the seconds and the count of each check go to its kind (``steps`` says the
    step; the last step's check and the one at the fit's end are both "last")."""
    check = Engine.check

    @functools.wraps(check)
    def timed(engine: Engine) -> Any:
        start = time.perf_counter()
        try:
            return check(engine)
        finally:
            kind = check_kind(steps.step)
            seconds[kind] += time.perf_counter() - start
            calls[kind] += 1

    Engine.check = timed  # type: ignore[method-assign]


def fit_once(*timers: Timer) -> None:
    """One fit of the small CNN with ``Doctor()``, each timer told the training step."""
    torch.manual_seed(0)
    loaders = random_loaders(STEPS // EPOCHS, 64, (1, 28, 28))
    cbs = [Steps(*timers), Doctor(quiet=True)]
    hs.Learner(small_cnn(), loaders, nn.CrossEntropyLoss(), lr=1e-3, cbs=cbs, progress=False).fit(EPOCHS)


def table(title: str, seconds: dict[str, float], count: int, rows: list[tuple[str, str | None]]) -> None:
    """Each top-level part that ran, with the parts inside it indented under it."""
    print(title)

    def show(parent: str | None, depth: int) -> None:
        for label, outer in rows:
            if outer == parent and label in seconds:
                print(f"{'    ' * depth}  {seconds.get(label, 0.0) / count * 1e6:8.1f} µs  {label}")
                show(label, depth + 1)

    show(None, 0)


def main() -> None:
    args = benchmark_args(__doc__.splitlines()[0], {}, {})
    rounds = 1 if args.quick else args.rounds
    torch.set_num_threads(1)
    watched = Watched()
    fit_once()  # warm-up: imports, numpy's and torch's first calls; the looks of a fit
    steps = Timer(step_kind)
    checks = Timer(lambda step: "plain" if plain_check(step) else None)
    for cls, name, parent in STEP_PARTS:
        steps.wrap(cls, name, top=parent is None)
    for cls, label in HOOKS.items():
        steps.wrap_hooks(cls, label)
    for cls, name, _ in CHECK_PARTS:
        checks.wrap(cls, name)
    by_kind: dict[str, float] = defaultdict(float)
    kinds: Counter[str] = Counter()
    time_checks(by_kind, kinds, steps)
    for _ in range(rounds):
        fit_once(steps, checks)  # each timer counts on its own steps of the same fits
    plain_steps = rounds * sum(plain(s) for s in range(STEPS))
    recorded = rounds * sum(step_kind(s) == "recorded" for s in range(STEPS))
    plain_checks = rounds * sum(plain_check(s) for s in range(STEPS) if checked(s))
    step_rows = [(f"{c.__name__}.{n}", p) for c, n, p in STEP_PARTS] + [(h, None) for h in HOOKS.values()]
    top = sum(steps.seconds["plain"].get(label, 0.0) for label, parent in step_rows if parent is None)
    print(f"Doctor() from the inside: small CNN, {STEPS}-step fits x {rounds} rounds, 1 thread, perf_counter")
    print(
        f"  {top / plain_steps * 1e6:8.1f} µs per plain step inside the Doctor's parts ({plain_steps} steps)"
    )
    table("  per plain step:", steps.seconds["plain"], plain_steps, step_rows)
    for label, looked in (("looked at by the protocol", True), ("not looked at", False)):
        chosen = [s for s in range(STEPS) if plain(s) and (s in watched.steps) == looked]
        inside = sum(steps.per_step[s] for s in chosen) / rounds
        print(f"  {inside / len(chosen) * 1e6:8.1f} µs per plain step {label} ({rounds * len(chosen)} steps)")
    inside = sum(steps.seconds["recorded"].get(label, 0.0) for label, p in step_rows if p is None)
    print(f"  {inside / recorded * 1e6:8.1f} µs per recorded step after the warm-up ({recorded} steps)")
    table(
        f"  per recorded step after the warm-up ({recorded} steps):",
        steps.seconds["recorded"],
        recorded,
        step_rows,
    )
    table(
        f"  per check ({plain_checks} checks without new statistics):",
        checks.seconds["plain"],
        plain_checks,
        [(f"{c.__name__}.{n}", p) for c, n, p in CHECK_PARTS],
    )
    print(f"  every check of a fit, by kind ({sum(by_kind.values()) / rounds * 1e3:.1f} ms a fit in all):")
    for kind, calls in kinds.items():
        count, total = calls // rounds, by_kind[kind] / rounds
        print(f"    {count:3d} x {total / count * 1e3:6.2f} ms = {total * 1e3:6.1f} ms a fit  {kind}")


if __name__ == "__main__":
    main()
