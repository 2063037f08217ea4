"""How long ``hs.preflight`` takes before a training run: the digits CNN (the target: under 10 s on 2 CPU
cores; torch's intra-op threads at 1 and 2), the small CNN of ``stats_overhead.py`` (1x28x28, batch 64)
and ResNet18 on batches of 8 3x224x224 images (one thread), as the doctor's overhead is measured.

Every check runs: data statistics, the probe forward, the batch-mixing backward passes, the loss at
initialisation and the overfitting of one batch (16 samples, or the batch when smaller; it stops once the
loss reaches its goal). ``--clock cpu`` reads the process's CPU time (all of torch's threads), steadier on
a loaded machine; ``--quick`` skips ResNet18.

    cd benchmarks && ../.venv/bin/python preflight_time.py [--quick] [--rounds N] [--clock wall|cpu]
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from common import benchmark_args, median, run_alternating
from stats_overhead import loaders, small_cnn
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchvision.models import resnet18

import hookscope as hs
from hookscope.data.digits import digits_loaders
from hookscope.models import digits_cnn

CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


def timed(
    build: Callable[[], nn.Module], data: Any, threads: int, clock: Callable[[], float]
) -> Callable[[], float]:
    """One preflight of a freshly built model on ``data``; returns the seconds it took."""

    def run() -> float:
        torch.manual_seed(0)
        model = build()
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            start = clock()
            findings = hs.preflight(model, data, nn.CrossEntropyLoss())
            seconds = clock() - start
        finally:
            torch.set_num_threads(previous)
        if findings:
            raise RuntimeError(f"a healthy model gave findings: {[str(f) for f in findings]}")
        return seconds

    return run


def images(n: int, size: int) -> DataLoader:
    """``n`` random 3x``size``x``size`` images with random labels among 10, batches of 8."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, size, size, generator=gen)
    return DataLoader(TensorDataset(x, torch.randint(0, 10, (n,), generator=gen)), batch_size=8)


def main() -> None:
    args = benchmark_args(__doc__.splitlines()[0])
    clock = CLOCKS[args.clock]
    rounds = 1 if args.quick else args.rounds
    digits = digits_loaders(batch_size=64)
    variants = {
        f"digits CNN, {threads} thread(s)": timed(digits_cnn, digits, threads, clock) for threads in (1, 2)
    }
    variants["stats_overhead small CNN, 1 thread"] = timed(small_cnn, loaders(4), 1, clock)
    if not args.quick:
        resnet = partial(resnet18, weights=None, num_classes=10)
        variants["ResNet18 8x3x224x224, 1 thread"] = timed(resnet, images(32, 224), 1, clock)
    next(iter(variants.values()))()  # warm-up: first-call costs (imports, allocator) are not preflight's
    times = run_alternating(variants, rounds)
    print(f"hs.preflight, {args.clock} clock, median of {rounds} round(s)")
    for name, seconds in times.items():
        print(f"  {name:<36}{median(seconds):>8.2f} s   (min {min(seconds):.2f}, max {max(seconds):.2f})")


if __name__ == "__main__":
    main()
