"""How much code ``Doctor()`` runs in a training step: the calls it adds, counted rather than timed.

Inside a small CNN's step the Doctor's per-step path costs what its code costs on caches the step's
kernels left cold: about 0.76 µs a call, against 0.16 µs in a tight loop (docs/benchmarks.md, stop 35).
Yet on a shared 2-core VM the step's own time moves by more than 2% between runs, more than any part of
that path costs, so a change to it rarely shows in ``doctor_overhead.py``. A count does: it is exact and
the same on every machine.

The small CNN of ``doctor_overhead.py`` trains for one epoch of 100 steps, bare and with ``Doctor()`` at its
defaults, under ``sys.setprofile``; the calls of steps 41 to 48 are counted. Those steps are neither
recorded (the warm-up is steps 0-4, then every 50th) nor right after a record, nor checked (the rules run
at the end of steps 4, 24, 44, 64), and the protocol's device checks do not look at them (every step of
the first 32, then 4 in every 32: steps 32-35 and 64-67); the count stops with an error when a default
moves a check or a record into them. Until stop 39 steps 21 to 28 were counted (older figures include
the protocol's fingerprint, label copy and graph tag), until stop 52 steps 41 to 48 (from stop 51 on,
with the check of step 44 in them). Python calls are listed by module and function, calls into
C (``isinstance``, tensor methods) apart. The bare Learner's calls are subtracted, so what is listed is the
Doctor's.

    python benchmarks/doctor_calls.py [--top N]
"""

from __future__ import annotations

import sys
from collections import Counter
from types import FrameType
from typing import Any

import torch
from common import benchmark_args
from doctor_overhead import random_loaders
from stats_overhead import small_cnn
from torch import nn

import hookscope as hs
from hookscope.train.callback import Callback

FIRST, LAST = 52, 59  # the steps counted (see the module's docstring)
C = "C"  # the module name under which calls into C are counted


class CallCounter(Callback):
    """Counts every call of the training steps ``FIRST`` to ``LAST`` by (module, function)."""

    order = -1000  # first in every event: the window opens before anything else of the step runs

    def __init__(self) -> None:
        self.calls: Counter[tuple[str, str]] = Counter()
        self.special: set[int] = set()  # the steps the Doctor recorded or checked
        self._on = False

    def before_batch(self) -> None:
        if self.learn.training:
            self._on = FIRST <= self.learn.training_step <= LAST

    def after_fit(self) -> None:
        self._on = False

    def profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if not self._on:
            return
        if event == "call":
            self.calls[(_module(frame.f_code.co_filename), frame.f_code.co_name)] += 1
        elif event == "c_call":
            self.calls[(C, getattr(arg, "__qualname__", repr(arg)))] += 1


def _module(filename: str) -> str:
    """A file as a short module path: ``hookscope/doctor/engine.py``, ``torch/optim/adam.py``."""
    for root in ("/src/", "/site-packages/"):
        if root in filename:
            return filename.rsplit(root, 1)[1]
    return filename


def count(doctor: bool) -> Counter[tuple[str, str]]:
    """The calls of the counted steps, bare or with ``Doctor()`` at its defaults."""
    torch.manual_seed(0)
    counter = CallCounter()
    cbs: list[Callback] = [counter]
    if doctor:
        cbs.append(doctored := hs.callbacks.Doctor(quiet=True))
        engine = doctored.engine
        # the check runs in the step's after_batch, when training_step already counts the step
        engine.after_check.append(lambda _: counter.special.add(learn.training_step - 1))
    loaders = random_loaders(100, 64, (1, 28, 28))
    learn = hs.Learner(small_cnn(), loaders, nn.CrossEntropyLoss(), lr=1e-3, cbs=cbs, progress=False)
    sys.setprofile(counter.profile)
    try:
        learn.fit(1)
    finally:
        sys.setprofile(None)
    if doctor:
        counter.special.update(s for s in range(FIRST - 1, LAST + 1) if engine.cadence(s))
    clash = sorted(s for s in counter.special if FIRST - 1 <= s <= LAST)
    if clash:
        raise SystemExit(
            f"doctor_calls.py: steps {FIRST}-{LAST} are not plain: the Doctor recorded or checked step(s) "
            f"{clash} (a record counts for the step after it too); move FIRST and LAST past them"
        )
    return counter.calls


def report(bare: Counter[tuple[str, str]], doctored: Counter[tuple[str, str]], top: int) -> str:
    """The table: calls a step, bare and with the Doctor, and the Doctor's by module and function."""
    steps = LAST - FIRST + 1
    added = doctored - bare
    python = {key: n for key, n in added.items() if key[0] != C}
    into_c = sum(n for key, n in added.items() if key[0] == C)
    by_module: Counter[str] = Counter()
    for (module, _), n in python.items():
        by_module[module] += n
    lines = [
        f"Calls a training step makes, neither recorded nor checked (steps {FIRST}-{LAST}, small CNN, "
        "sys.setprofile):",
        f"  bare Learner        {sum(bare.values()) / steps:7.1f}",
        f"  + Doctor()          {sum(doctored.values()) / steps:7.1f}",
        f"  the Doctor adds     {sum(added.values()) / steps:7.1f}: "
        f"{sum(python.values()) / steps:.1f} Python calls of {len(python)} functions, "
        f"{into_c / steps:.1f} calls into C",
        "  its Python calls a step, by module:",
        *(f"    {n / steps:6.1f}  {module}" for module, n in by_module.most_common(top)),
        "  its calls a step, by function:",
        *(f"    {n / steps:6.1f}  {module}:{name}" for (module, name), n in added.most_common(top)),
    ]
    return "\n".join(lines)


def main() -> None:
    args = benchmark_args(__doc__.splitlines()[0], counts={"--top": (15, "modules and functions listed")})
    torch.set_num_threads(1)
    bare, doctored = count(doctor=False), count(doctor=True)
    print(report(bare, doctored, max(1, args.top)))


if __name__ == "__main__":
    main()
