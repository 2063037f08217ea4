"""How long ``hs.preflight`` takes before a training run: the digits CNN (the target: under 10 s on 2 CPU
cores) and an MLP on the digits, with torch's intra-op threads at 1 and 2.

Every check runs: data statistics, the probe forward, the batch-mixing backward passes, the loss at
initialisation and the overfitting of one batch of 16 samples (it stops once the loss reaches its goal).
``--clock cpu`` reads the process's CPU time (all of torch's threads), steadier on a loaded machine.

    .venv/bin/python benchmarks/preflight_time.py [--quick] [--rounds N] [--clock wall|cpu]
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from common import benchmark_args, median, run_alternating
from torch import nn

import hookscope as hs
from hookscope.data.digits import digits_loaders
from hookscope.models import digits_cnn, mlp

CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


def timed(build: Callable[[], nn.Module], threads: int, clock: Callable[[], float]) -> Callable[[], float]:
    """One preflight of a freshly built model on the digits; returns the seconds it took."""
    loaders = digits_loaders(batch_size=64)

    def run() -> float:
        torch.manual_seed(0)
        model = build()
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            start = clock()
            findings = hs.preflight(model, loaders, nn.CrossEntropyLoss())
            seconds = clock() - start
        finally:
            torch.set_num_threads(previous)
        if findings:
            raise RuntimeError(f"a healthy model gave findings: {[str(f) for f in findings]}")
        return seconds

    return run


def main() -> None:
    args = benchmark_args(__doc__.splitlines()[0])
    clock = CLOCKS[args.clock]
    rounds = 1 if args.quick else args.rounds
    variants = {
        f"{name}, {threads} thread(s)": timed(build, threads, clock)
        for name, build in (("digits CNN", digits_cnn), ("MLP 64-128-10", lambda: mlp((64, 128, 10))))
        for threads in (1, 2)
    }
    next(iter(variants.values()))()  # warm-up: first-call costs (imports, allocator) are not preflight's
    times = run_alternating(variants, rounds)
    print(f"hs.preflight, {args.clock} clock, median of {rounds} round(s)")
    for name, seconds in times.items():
        print(f"  {name:<32}{median(seconds):>8.2f} s   (min {min(seconds):.2f}, max {max(seconds):.2f})")


if __name__ == "__main__":
    main()
