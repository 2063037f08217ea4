"""What a step the Doctor records costs, against the unrecorded step beside it in the same fit.

``doctor_overhead.py`` compares whole fits, and on a shared machine two fits of the same code differ by
more than the Doctor's cost. Two neighbouring steps of one fit do not. Here ``Doctor(every=2)`` records
every even training step of the small CNN (1x28x28, batch 64, one thread); each recorded step is paired
with the unrecorded step after it (both past step 20, neither a check nor right after one), and the
median difference of a fit is what recording a step costs: the statistics hooks, their reductions on
the device and the snapshot, with the hooks switched on and off around it.

The same is taken with parts of the recording left out: the activation statistics, the output-gradient
statistics (the tensor hooks on each watched output), the update ratios, and all three (what is left is
switching the cadence). The table gives the median over the rounds.

    python benchmarks/recorded_step.py [--quick] [--rounds N]
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch
from common import benchmark_args, run_alternating
from doctor_overhead import random_loaders
from doctor_step_kinds import StepClock
from stats_overhead import small_cnn
from torch import nn

import hookscope as hs

FIRST = 20  # steps before the first pair: the warm-up and the first check
PARTS = ("activations", "output gradients", "update ratios")


def recording_without(*parts: str) -> hs.callbacks.Doctor:
    """``Doctor(every=2)`` whose recorded steps leave ``parts`` out."""
    doctor = hs.callbacks.Doctor(quiet=True, every=2)
    engine = doctor.engine
    if "activations" in parts:
        activations = engine.activations
        begin = type(activations).begin_batch
        # the cadence still says "recorded" to the others; the activation recorder hears "not recorded"
        activations.begin_batch = lambda step, training, recorded: begin(activations, step, training, False)
    if "output gradients" in parts:
        engine.gradients.output_grads = False
    if "update ratios" in parts:
        engine.gradients.update_ratio = False
    return doctor


def paired_extra(clock: StepClock) -> float:
    """Median seconds a recorded step took more than the unrecorded step after it."""
    seconds, recorded = np.array(clock.seconds), np.array(clock.recorded)
    steps = np.arange(len(seconds))
    checked = np.isin(steps, sorted(clock.checked))
    usable = (steps >= FIRST) & ~checked & ~np.roll(checked, 1)
    pairs = [
        seconds[i] - seconds[i + 1]
        for i in range(len(seconds) - 1)
        if recorded[i] and not recorded[i + 1] and usable[i] and usable[i + 1]
    ]
    return float(np.median(pairs))


def fit(loaders: tuple, epochs: int, parts: tuple[str, ...], extras: list[float]) -> float:
    """One fit with ``Doctor(every=2)`` less ``parts``; appends its paired extra to ``extras``."""
    torch.manual_seed(0)
    doctor = recording_without(*parts)
    clock = StepClock(time.thread_time, doctor)
    learn = hs.Learner(
        small_cnn(), loaders, nn.CrossEntropyLoss(), lr=1e-3, cbs=[clock, doctor], progress=False
    )
    learn.fit(epochs)
    extras.append(paired_extra(clock))
    return sum(clock.seconds) / len(clock.seconds)


def main() -> None:
    args = benchmark_args(__doc__.splitlines()[0])
    steps, rounds = (60, 1) if args.quick else (200, args.rounds)
    torch.set_num_threads(1)
    loaders = random_loaders(steps // 2, 64, (1, 28, 28))
    variants: dict[str, tuple[str, ...]] = {"every part": ()}
    variants.update({f"without {part}": (part,) for part in PARTS})
    variants["none of them"] = PARTS
    extras: dict[str, list[float]] = {name: [] for name in variants}
    fits: dict[str, Callable[[], float]] = {
        name: lambda parts=parts, kept=extras[name]: fit(loaders, 2, parts, kept)
        for name, parts in variants.items()
    }
    times = run_alternating(fits, rounds)
    print(
        f"A recorded step against the unrecorded one after it: small CNN 1x28x28, batch 64, {steps} steps x "
        f"{rounds} rounds, 1 thread, thread CPU time"
    )
    for name in variants:
        step_ms = np.median(times[name]) * 1e3
        print(f"  {name:28} {np.median(extras[name]) * 1e3:6.2f} ms more (step {step_ms:.2f} ms)")


if __name__ == "__main__":
    main()
