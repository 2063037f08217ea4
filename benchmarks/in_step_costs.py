"""What a small piece of host work costs inside a training step, against the same work in a tight loop.

The Doctor's per-step path is a few hundred Python calls, a few small ops and one or two system calls.
Timed alone, in a loop, each costs well under a microsecond to a few microseconds; inside a step it costs
several times more, because the step's kernels stream megabytes through the caches and the interpreter
and torch's dispatcher then run from memory. This puts numbers on it, on the small CNN of
``doctor_overhead.py`` in a hand-written loop (AdamW, batch 64, one thread):

- each candidate is called right after the backward, where the guard decides, and timed there (median
  over the steps), beside its median in a tight loop of 2,000 calls;
- the guard's decision (``NonFiniteCheck.decide``: one fused norm of the gradients and the loss, a stack,
  one read) is called three times in a row after the backward: the first call pays for the cold caches,
  the next two show what is left.

    python benchmarks/in_step_costs.py [--quick] [--rounds N]

``--rounds`` sets the steps timed (x 100).
"""

from __future__ import annotations

import os
import resource
import threading
import time
from collections.abc import Callable

import torch
from common import benchmark_args, median
from stats_overhead import small_cnn
from torch import nn

from hookscope.doctor.guard import NonFiniteCheck
from hookscope.doctor.timing import memory


def candidates() -> dict[str, Callable[[], object]]:
    """Host work of the kinds the Doctor's per-step path does: a Python call, clock reads, reads of
    ``/proc`` files and glibc's heap statistics."""
    schedstat = os.open(f"/proc/self/task/{threading.get_native_id()}/schedstat", os.O_RDONLY)
    statm = os.open("/proc/self/statm", os.O_RDONLY)
    work: dict[str, Callable[[], object]] = {
        "an empty Python call": lambda: None,
        "time.perf_counter()": time.perf_counter,
        "time.thread_time()": time.thread_time,
        "getrusage(RUSAGE_THREAD)": lambda: resource.getrusage(resource.RUSAGE_THREAD),
        "pread /proc/.../schedstat": lambda: os.pread(schedstat, 128, 0),
        "pread /proc/self/statm": lambda: os.pread(statm, 128, 0),
    }
    reader = memory._in_use(lambda: 0)  # the memory probe's own binding of glibc's mallinfo2
    if isinstance(reader, memory._InUse):  # glibc 2.33 and later
        work["mallinfo2() (heap walk)"] = reader.mallinfo2
    return work


def tight(fn: Callable[[], object], calls: int = 2000) -> float:
    """Seconds per call of ``fn`` called ``calls`` times in a row."""
    for _ in range(50):
        fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def in_step(work: dict[str, Callable[[], object]], steps: int) -> dict[str, list[float]]:
    """Seconds each piece of ``work`` took right after a training step's backward, per step (the pieces
    take turns, one per step); plus the guard's decision called three times in a row."""
    torch.manual_seed(0)
    model = small_cnn()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
    params = list(model.parameters())
    check = NonFiniteCheck(False, lambda module: True)
    decides = ("guard decision, 1st call", "guard decision, 2nd call", "guard decision, 3rd call")
    seconds: dict[str, list[float]] = {name: [] for name in (*work, *decides)}
    names = [*work, decides[0]]
    for step in range(steps + 20):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        name = names[step % len(names)]
        if name in work:
            start = time.perf_counter()
            work[name]()
            seconds[name].append(time.perf_counter() - start)
        else:
            for label in decides:
                check.loss(loss)
                start = time.perf_counter()
                check.decide(params, loss.device)
                seconds[label].append(time.perf_counter() - start)
        opt.step()
    return {name: values[2:] for name, values in seconds.items()}  # the first steps warm up


def main() -> None:
    args = benchmark_args(__doc__.splitlines()[0])
    steps = 40 if args.quick else 100 * args.rounds
    torch.set_num_threads(1)
    work = candidates()
    alone = {name: tight(fn) for name, fn in work.items()}
    check = NonFiniteCheck(False, lambda module: True)
    model = small_cnn()
    nn.functional.cross_entropy(model(torch.randn(64, 1, 28, 28)), torch.randint(0, 10, (64,))).backward()
    params, loss = list(model.parameters()), torch.tensor(1.0)

    def decide() -> None:
        check.loss(loss)
        check.decide(params, loss.device)

    alone["guard decision, 1st call"] = tight(decide)
    inside = in_step(work, steps)
    print(f"Host work after a small-CNN backward vs in a tight loop ({steps} steps, 1 thread, wall clock):")
    print(f"  {'':32}{'in the step':>14}{'alone':>12}")
    for name, values in inside.items():
        alone_us = f"{alone[name] * 1e6:9.2f} us" if name in alone else ""
        print(f"  {name:32}{median(values) * 1e6:11.1f} us{alone_us:>12}")


if __name__ == "__main__":
    main()
