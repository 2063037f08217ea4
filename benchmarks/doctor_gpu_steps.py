"""Where ``Doctor()``'s time goes on a GPU, by kind of training step: plain, check, recorded.

``doctor_overhead.py --cuda`` gives one ratio per fit; this splits it. Each training step's end is marked
three ways by a callback that runs last: a CUDA event (the device's time between two step ends), the wall
clock and this thread's CPU time (the host's). Steps are sorted into those the Doctor recorded (the
warm-up's first 5, then every 50th: per-layer statistics, hooks on), check
steps (the warm-up's end, then every 20th: the rules read their values in one bulk transfer) and plain
steps, and the medians and sums printed for the bare
Learner, ``Doctor()`` and ``Doctor(guard=False)`` (the guard reads one value per step before
``opt.step()``, which makes the host wait for the device).

Read it as: where a plain step's device interval equals the bare one, the Doctor's host work hides behind
the device's; where the host interval exceeds the device one, the step is bound by the host.

    python benchmarks/doctor_gpu_steps.py              # small CNN and ResNet18 (batch 64), 300 steps
    python benchmarks/doctor_gpu_steps.py resnet       # one of them
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from itertools import pairwise

import torch
from doctor_overhead import random_loaders, resnet18
from stats_overhead import small_cnn
from torch import nn
from torch.utils.data import DataLoader

import hookscope as hs
from hookscope.doctor.engine import CHECK_EVERY

STEPS, BATCH, WARMUP = 300, 64, 5
MODELS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...], int]] = {
    "cnn": (small_cnn, (1, 28, 28), 3),  # builder, input shape, rounds
    "resnet": (resnet18, (3, 224, 224), 2),
}


class StepEnds(hs.Callback):
    """A CUDA event, the wall clock and the thread's CPU time at the end of each training step."""

    order = 10_000  # after every other callback's after_batch

    def __init__(self) -> None:
        self.events: list[torch.cuda.Event] = []
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def after_batch(self) -> None:
        if not self.learn.training:
            return
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        self.events.append(event)
        self.wall.append(time.perf_counter())
        self.cpu.append(time.thread_time())

    def intervals_ms(self) -> dict[str, list[float]]:
        """Per step (the first is 0): device, wall and CPU milliseconds since the step before."""
        device = [a.elapsed_time(b) for a, b in pairwise(self.events)]
        wall = [(b - a) * 1e3 for a, b in pairwise(self.wall)]
        cpu = [(b - a) * 1e3 for a, b in pairwise(self.cpu)]
        return {"device": [0.0, *device], "wall": [0.0, *wall], "cpu": [0.0, *cpu]}


def fit(build: Callable[[], nn.Module], loaders: tuple[DataLoader, DataLoader], doctor: dict | None):
    """One epoch on the GPU: ms per step of the whole fit, the per-step intervals, the recorded steps."""
    torch.manual_seed(0)
    ends = StepEnds()
    cbs = [ends] + ([hs.callbacks.Doctor(quiet=True, **doctor)] if doctor is not None else [])
    learn = hs.Learner(
        build(), loaders, nn.CrossEntropyLoss(), lr=1e-3, cbs=cbs, progress=False, device="cuda"
    )
    torch.cuda.synchronize()
    start = time.perf_counter()
    learn.fit(1)
    torch.cuda.synchronize()
    per_step = (time.perf_counter() - start) / len(ends.events) * 1e3
    recorded: set[int] = set()
    if doctor is not None:
        for history in learn.doctor.activations.history.values():
            recorded |= {record.step for record in history}
    return per_step, ends.intervals_ms(), recorded


def show(name: str, fits: list) -> None:
    """One variant: the median fit's ms per step, then per clock the medians and sums by kind of step."""
    per_step = statistics.median(f[0] for f in fits)
    _, intervals, recorded = fits[-1]
    n = len(intervals["device"])
    recorded = sorted(s for s in recorded if 0 < s < n)
    later = [s for s in range(WARMUP + 1, n) if s not in recorded]
    kinds = {
        "plain": [s for s in later if (s - WARMUP) % CHECK_EVERY],
        "check": [s for s in later if not (s - WARMUP) % CHECK_EVERY],
        "recorded": recorded,
    }
    print(f"{name:<22}{per_step:8.2f} ms/step (median of fits); recorded steps: {recorded}")
    for clock, values in intervals.items():
        medians = "  ".join(
            f"{kind} {statistics.median(values[s] for s in steps) if steps else float('nan'):7.2f}"
            for kind, steps in kinds.items()
        )
        print(
            f"   {clock:<7} median {medians}   sum: recorded {sum(values[s] for s in recorded):8.1f}"
            f"  all {sum(values):8.1f}"
        )


def main() -> None:
    names = sys.argv[1:] or list(MODELS)
    unknown = [name for name in names if name not in MODELS]
    if unknown:
        raise SystemExit(f"doctor_gpu_steps.py: unknown model {unknown[0]!r}; use {' or '.join(MODELS)}")
    if not torch.cuda.is_available():
        raise SystemExit("doctor_gpu_steps.py: no CUDA device is available here; it splits a GPU's time")
    torch.set_num_threads(1)
    variants = {"bare": None, "Doctor()": {}, "Doctor(guard=False)": {"guard": False}}
    for name in names:
        build, shape, rounds = MODELS[name]
        print(f"== {name}, {STEPS} steps of batch {BATCH}, {torch.cuda.get_device_name()}, milliseconds")
        for doctor in variants.values():
            fit(build, random_loaders(12, BATCH, shape), doctor)  # warm-up: cuDNN's choices, the allocator
        loaders = random_loaders(STEPS, BATCH, shape)
        fits: dict[str, list] = {variant: [] for variant in variants}
        for _ in range(rounds):
            for variant, doctor in variants.items():
                fits[variant].append(fit(build, loaders, doctor))
        for variant, results in fits.items():
            show(variant, results)


if __name__ == "__main__":
    main()
