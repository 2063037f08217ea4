"""What each part of ``Doctor()`` costs per training step, on a near-empty model where nothing else hides it.

A 4-8-3 MLP on random data (batch 8, 3 epochs of 300 steps, one thread) trains in the bare Learner and
with ``Doctor()`` at its defaults; then with one part of the Doctor left out at a time: the guard
(``guard=False``), the timing recorder or the protocol recorder (each swapped for a recorder that does
nothing, so the engine still calls it), the rules' checks (``check_every`` beyond the run). The table
gives the median microseconds per step over the rounds and, per part, what leaving it out saves: that
part's cost. The parts cost about the same in absolute terms on a real model, where
``doctor_overhead.py`` puts them in proportion.

The memory probe's ``mallinfo2`` walks malloc's free lists, which lengthen with every fit of the
process; it is left out of every variant here (the resident size alone is read) so that the rounds
compare alike — its cost is printed apart, at the start and at the end of the run.

    python benchmarks/doctor_parts.py [--quick] [--rounds N] [--clock cpu]
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from common import CLOCKS, benchmark_args, median, run_alternating
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hookscope as hs
from hookscope.doctor.timing import memory

STEPS, BATCH = 300, 8


class Silent:
    """A recorder that records nothing: the engine's calls reach it and return at once."""

    thinnings = 0
    compiled = False

    def pending(self) -> list:
        return []

    def findings(self, *args: Any, **kwargs: Any) -> list:
        return []

    def state_dict(self) -> dict:
        return {}

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args, **kwargs: None


def loaders(steps: int) -> tuple[DataLoader, DataLoader]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(steps * BATCH, 4, generator=generator)
    y = torch.randint(0, 3, (steps * BATCH,), generator=generator)
    train = DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True, generator=generator)
    return train, DataLoader(TensorDataset(x[:BATCH], y[:BATCH]), batch_size=BATCH)


def doctor_without(*parts: str) -> hs.callbacks.Doctor:
    """``Doctor()`` at its defaults, less ``parts`` (any of "guard", "timing", "protocol", "checks")."""
    doctor = hs.callbacks.Doctor(quiet=True, guard="guard" not in parts)
    engine = doctor.engine
    if "checks" in parts:
        engine.check_every = 1 << 62
    for part in {"timing", "protocol"} & set(parts):
        setattr(engine, part, Silent())
        kept = f"{part.title()}Recorder"
        engine._recorders = tuple(r for r in engine._recorders if r.__class__.__name__ != kept)
        engine._every_step = tuple(r for r in engine._every_step if r.__class__.__name__ != kept)
    if "timing" in parts:
        doctor.wrap_method = lambda event, method: method  # no callback timed either
    return doctor


def fit(
    data: tuple[DataLoader, DataLoader], epochs: int, clock: Callable[[], float], part: str | None, bare: bool
) -> float:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    cbs = [] if bare else [doctor_without(*[part] if part else [])]
    learn = hs.Learner(model, data, nn.CrossEntropyLoss(), lr=1e-3, cbs=cbs, progress=False)
    start = clock()
    learn.fit(epochs)
    return (clock() - start) / (epochs * len(data[0]))


def free_read_us() -> float:
    """Microseconds of one ``mallinfo2`` read now (0 where glibc has none)."""
    reader = memory._in_use(lambda: 0)
    if not isinstance(reader, memory._InUse):
        return 0.0
    start = time.perf_counter()
    for _ in range(20):
        reader.mallinfo2()
    return (time.perf_counter() - start) / 20 * 1e6


def main() -> None:
    args = benchmark_args(__doc__.splitlines()[0])
    steps, epochs, rounds = (30, 1, 1) if args.quick else (STEPS, 3, args.rounds)
    clock = CLOCKS[args.clock]
    torch.set_num_threads(1)
    free_at_start = free_read_us()
    memory._InUse.__call__ = lambda self: self.resident()  # the heap walk out of every variant (above)
    data = loaders(steps)
    parts = ("guard", "timing", "protocol", "checks")
    variants = {"bare Learner": lambda: fit(data, epochs, clock, None, True)}
    variants["Doctor()"] = lambda: fit(data, epochs, clock, None, False)
    for part in parts:
        variants[f"Doctor() without {part}"] = lambda part=part: fit(data, epochs, clock, part, False)
    for run in variants.values():
        run()
    times = {name: median(values) * 1e6 for name, values in run_alternating(variants, rounds).items()}
    print(
        f"Doctor() by part: a 4-8-3 MLP, batch {BATCH}, {epochs} x {steps} steps x {rounds} rounds, "
        f"{args.clock} clock"
    )
    bare, doctor = times["bare Learner"], times["Doctor()"]
    print(f"  {'bare Learner':<28}{bare:9.1f} µs/step")
    print(f"  {'Doctor()':<28}{doctor:9.1f} µs/step   +{doctor - bare:.1f}")
    for part in parts:
        without = times[f"Doctor() without {part}"]
        print(f"  {'  without ' + part:<28}{without:9.1f} µs/step   saves {doctor - without:.1f}")
    print(f"  one mallinfo2 read: {free_at_start:.1f} µs at the start, {free_read_us():.1f} µs at the end")


if __name__ == "__main__":
    main()
