"""Where ``Doctor()``'s cost falls on the small CNN: by kind of step, and by the part that runs in it.

``doctor_overhead.py`` gives one ratio per fit. This splits it. Each training step's thread CPU time
(from the first callback's ``before_batch`` to the last one's ``after_batch``) is taken in the bare
Learner and in ``Doctor()``, and the steps are told apart by what the Doctor did in them:

- recorded: the cadence recorded the step (every step of the warm-up, then every 50th);
- checked: the rules ran at the end of the step (the warm-up's last, then every 20th), the step not
  recorded;
- plain: neither; most steps of any run.

The same is measured with only one of the Doctor's three per-step parts left in (the guard, the timing
recorder or the protocol recorder; the others swapped for recorders that do nothing, as
``doctor_parts.py`` does), and with none of them (the engine alone: the loss, the cadence's statistics
and the rules). Per step index the median over the rounds is taken; the table gives, for each kind,
the median extra milliseconds a step against the bare Learner and that kind's share of the bare fit.
The parts are not additive: each one's share is what it costs with the others left out.

The timing recorder's memory probe walks malloc's free lists (``mallinfo2``), which lengthen with every
fit this process runs; ``--no-heap-walk`` leaves the walk out of every variant to show its share.

    python benchmarks/doctor_step_kinds.py [--quick] [--rounds N] [--clock cpu] [--no-heap-walk]
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np
import torch
from common import CLOCKS, benchmark_args, run_alternating
from doctor_overhead import random_loaders
from doctor_parts import doctor_without
from stats_overhead import small_cnn
from torch import nn

import hookscope as hs
from hookscope.doctor.timing import memory
from hookscope.train.callback import Callback

PARTS = ("guard", "timing", "protocol")


class StepClock(Callback):
    """Each training step's time, from the first callback's ``before_batch`` (this one, ``order``
    lowest) to the last one's ``after_batch`` (its ``Last`` companion); which steps the Doctor recorded
    and checked."""

    order = -10_000

    def __init__(self, clock: Callable[[], float], doctor: hs.callbacks.Doctor | None) -> None:
        self.clock, self.doctor = clock, doctor
        self.seconds: list[float] = []
        self.recorded: list[bool] = []
        self.checked: set[int] = set()
        self._end = _StepEnd(self)
        if doctor is not None:
            # the check runs in the step's after_batch, when training_step already counts the step
            doctor.engine.after_check.append(lambda _: self.checked.add(self.learn.training_step - 1))

    @property
    def companions(self) -> list[Callback]:
        return [self._end]

    def before_batch(self) -> None:
        if self.learn.training:
            self.seconds.append(self.clock())
            cadence = self.doctor.engine.cadence if self.doctor is not None else None
            self.recorded.append(cadence is not None and cadence(self.learn.training_step))


class _StepEnd(Callback):
    order = 10_000

    def __init__(self, owner: StepClock) -> None:
        self.owner = owner

    def after_batch(self) -> None:
        if self.learn.training:
            self.owner.seconds[-1] = self.owner.clock() - self.owner.seconds[-1]


def fit(
    loaders: tuple, epochs: int, clock: Callable[[], float], keep: tuple[str, ...] | None, runs: list
) -> float:
    """One fit, bare (``keep=None``) or with ``Doctor()`` keeping only the parts in ``keep``; appends its
    StepClock to ``runs`` and returns the fit's seconds per step."""
    torch.manual_seed(0)
    doctor = None if keep is None else doctor_without(*(p for p in PARTS if p not in keep))
    steps = StepClock(clock, doctor)
    cbs = [steps] + ([doctor] if doctor is not None else [])
    learn = hs.Learner(small_cnn(), loaders, nn.CrossEntropyLoss(), lr=1e-3, cbs=cbs, progress=False)
    learn.fit(epochs)
    runs.append(steps)
    return sum(steps.seconds) / len(steps.seconds)


def kinds_of(run: StepClock) -> dict[str, np.ndarray]:
    recorded = np.array(run.recorded)
    checked = np.isin(np.arange(len(recorded)), sorted(run.checked)) & ~recorded
    return {"recorded": recorded, "checked": checked, "plain": ~recorded & ~checked}


def main() -> None:
    args = benchmark_args(
        __doc__.splitlines()[0],
        {"--no-heap-walk": "the CPU memory probe reads the resident size alone (no mallinfo2)"},
    )
    if args.no_heap_walk:
        memory._InUse.__call__ = lambda self: self.resident()
    steps, rounds = (30, 1) if args.quick else (300, args.rounds)
    clock = CLOCKS[args.clock]
    torch.set_num_threads(1)
    loaders = random_loaders(steps // 3, 64, (1, 28, 28))
    variants = {"bare Learner": None, "Doctor()": PARTS, **{f"{p} alone": (p,) for p in PARTS}}
    variants["engine alone"] = ()
    runs: dict[str, list[StepClock]] = {name: [] for name in variants}
    run_alternating(
        {name: partial(fit, loaders, 3, clock, keep, runs[name]) for name, keep in variants.items()}, rounds
    )
    per_step = {name: np.median([r.seconds for r in kept], axis=0) for name, kept in runs.items()}
    bare = per_step.pop("bare Learner")
    kinds = kinds_of(runs["Doctor()"][0])
    print(
        f"Doctor() by kind of step: small CNN 1x28x28, batch 64, {steps} steps x {rounds} rounds, 1 thread, "
        f"{args.clock} clock{', no heap walk' if args.no_heap_walk else ''}; bare step "
        f"{np.median(bare) * 1e3:.2f} ms"
    )
    print("  extra ms a step (share of the bare fit)  " + "".join(f"{k:>20}" for k in [*kinds, "total"]))
    counts = "".join(f"{f'{int(m.sum())} steps':>20}" for m in kinds.values())
    print(f"  {'':42}{counts}")
    for name, seconds in per_step.items():
        extra = seconds - bare
        cells = [
            f"{np.median(extra[m]) * 1e3:.2f} ({extra[m].sum() / bare.sum():.1%})" for m in kinds.values()
        ]
        cells.append(f"{extra.sum() / bare.sum():.1%}")
        print(f"  {name:42}" + "".join(f"{c:>20}" for c in cells))


if __name__ == "__main__":
    main()
