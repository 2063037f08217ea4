"""Cost of watching activations and gradients during training, per step, on a small CNN.

Variants, run alternating in the same process (medians over rounds):

- ``hookscope Learner``: the bare loop (baseline);
- ``+ ActivationStats`` and ``+ ActivationStats + GradientStats``: the monitor callbacks with
  ``every=1`` and their defaults (layers: the modules that own parameters, as fastai's ActivationStats;
  GradientStats: per-parameter gradient norms and update ratios); ``+ both, output_grads=True`` adds
  GradientStats' per-layer statistics of output gradients, which cost as much as the activation
  statistics;
- ``+ Doctor(every=1)``: the Doctor, which watches every leaf module (ReLUs and pools too), plus its
  NonFiniteGuard and saturation hooks;
- ``fastai Learner`` and ``fastai + ActivationStats(every=1)`` (mean, std, near-zero share; with
  ``with_hist=True`` also the histogram its colorful-dimension plot needs): fastai's loop and its own
  statistics callback on the same model, data and optimizer (skipped when fastai is not installed).

Model and data: two 3x3 convs (1->16->32 channels, ReLU, max-pool) and a linear head on 1x28x28 inputs,
batch 64, AdamW(lr=1e-3), in-memory tensors, CPU, one thread; an epoch of 100 steps ends with one
validation batch.
Target: the monitored Learner at most 1.10x the bare one. Times are CPU time of this process
(``time.process_time``): with one thread that is the work done, and a busy shared machine inflates wall
time by whatever else runs there (we saw 3x swings between identical runs).

    python benchmarks/stats_overhead.py            # full run
    python benchmarks/stats_overhead.py --quick    # smoke test
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

import torch
from common import (  # benchmarks/
    benchmark_args,
    format_table,
    median,
    optional_import,
    paired_ratio,
    run_alternating,
)
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hookscope as hs

BATCH = 64


def small_cnn() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 7 * 7, 10),
    )


def loaders(steps: int) -> tuple[DataLoader, DataLoader]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(steps * BATCH, 1, 28, 28, generator=gen)
    y = torch.randint(0, 10, (steps * BATCH,), generator=gen)
    train = DataLoader(TensorDataset(x, y), batch_size=BATCH)
    valid = DataLoader(TensorDataset(x[:BATCH], y[:BATCH]), batch_size=BATCH)
    return train, valid


def hookscope_run(
    steps: int, activations: bool, gradients: bool, output_grads: bool = False, doctor: bool = False
) -> float:
    """Seconds per training step of one epoch of ``steps`` batches."""
    train, valid = loaders(steps)
    cbs: list[hs.Callback] = [hs.callbacks.Doctor(every=1, quiet=True)] if doctor else []
    if activations:
        cbs.append(hs.callbacks.ActivationStats(every=1))
    if gradients:
        cbs.append(hs.callbacks.GradientStats(every=1, output_grads=output_grads))
    learn = hs.Learner(small_cnn(), (train, valid), nn.CrossEntropyLoss(), lr=1e-3, cbs=cbs, progress=False)
    start = time.process_time()
    learn.fit(1)
    return (time.process_time() - start) / steps


def fastai_run(steps: int, monitored: bool, with_hist: bool = False) -> float:
    """The same epoch with fastai's Learner (and its ActivationStats when ``monitored``)."""
    from fastai.basics import DataLoaders, Learner, OptimWrapper
    from fastai.callback.hook import ActivationStats

    train, valid = loaders(steps)
    learn = Learner(
        DataLoaders(train, valid),
        small_cnn(),
        loss_func=nn.CrossEntropyLoss(),
        opt_func=partial(OptimWrapper, opt=torch.optim.AdamW),
        lr=1e-3,
        cbs=[ActivationStats(every=1, with_hist=with_hist)] if monitored else [],
    )
    with learn.no_logging():
        start = time.process_time()
        learn.fit(1)
    return (time.process_time() - start) / steps


def main() -> None:
    args = benchmark_args(__doc__.splitlines()[0])
    steps, rounds = (8, 2) if args.quick else (100, args.rounds)
    torch.set_num_threads(1)
    variants: dict[str, Callable[[], float]] = {
        "hookscope Learner": partial(hookscope_run, steps, False, False),
        "+ ActivationStats": partial(hookscope_run, steps, True, False),
        "+ ActivationStats + GradientStats": partial(hookscope_run, steps, True, True),
        "+ both, output_grads=True": partial(hookscope_run, steps, True, True, True),
        "+ Doctor(every=1)": partial(hookscope_run, steps, False, False, doctor=True),
    }
    fastai, reason = optional_import("fastai.basics")
    skipped = {}
    if fastai is None:
        skipped = {name: reason for name in ("fastai Learner", "fastai + ActivationStats")}
    else:
        variants["fastai Learner"] = partial(fastai_run, steps, False)
        variants["fastai + ActivationStats"] = partial(fastai_run, steps, True)
        variants["fastai + ActivationStats(with_hist)"] = partial(fastai_run, steps, True, True)
    for run in variants.values():  # warm-up: allocator, kernels, imports
        run()
    times = run_alternating(variants, rounds)
    per_step_us = {name: median(values) * 1e6 for name, values in times.items()}
    title = f"stats overhead: small CNN 1x28x28, batch {BATCH}, {steps} steps x {rounds} rounds, 1 thread"
    title += ", CPU time"
    print(format_table(title, per_step_us, "hookscope Learner", skipped))
    for name in ("+ ActivationStats + GradientStats", "+ both, output_grads=True"):
        ratio = paired_ratio(times, name, "hookscope Learner")
        print(f"  {name} vs bare, median of per-round ratios: {ratio:.3f}x (target <= 1.10x)")
    if "fastai Learner" in per_step_us:
        ratio = per_step_us["fastai + ActivationStats"] / per_step_us["fastai Learner"]
        print(f"  fastai ActivationStats vs bare fastai: {ratio:.2f}x")


if __name__ == "__main__":
    main()
