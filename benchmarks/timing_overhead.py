"""Cost of the doctor's timing (:class:`hookscope.doctor.timing.TimingRecorder`) per training step.

A plain loop trains a small CNN (two conv blocks and a linear head): 1x28x28 random images, batch 64,
AdamW, CPU, one thread, 300 steps. Bare, and with the recorder fed as ``hs.watch`` feeds the engine:
its own forward pre/post hooks on the model's root, the optimizer's step pre/post hooks (gradients
ready, step done, end of batch, next batch), the loss logged every step, the rules every
``hookscope.doctor.engine.CHECK_EVERY`` (20) steps.
Variants alternate over rounds; the table gives the median per-step time and the median of per-round
ratios. Target: at most 1.02x.

The recorder's few microseconds are below the noise of a CNN step on a busy machine, so a second table
times the same loop with a model that costs almost nothing (a linear layer on a 64-value crop, 2,000
steps): the difference per step is the recorder's own cost, which the first table's CNN step then puts
in proportion. A last line times the recorder's feed calls alone (no model, no hooks dispatched by
PyTorch): its own host work per step, with and without the checks.

glibc's allocator moves its mmap threshold as large blocks are freed, so the same loop can spend ~4 ms
per CNN step in page faults or none, depending on what else the process allocated before (the
recorder's numpy arrays shift it: the loop with the recorder then measures ~15% *faster*). The benchmark
fixes the threshold (``mallopt``) so both variants run under the same allocator state.

    python benchmarks/timing_overhead.py --clock cpu   # full run (CPU time: steadier on a busy machine)
    python benchmarks/timing_overhead.py --quick       # smoke test
"""

from __future__ import annotations

import ctypes
import sys
import time
from collections.abc import Callable

import torch
from common import (
    CLOCKS,
    benchmark_args,
    feed_from_optimizer,
    format_table,
    median,
    paired_ratio,
    run_alternating,
)
from protocol_overhead import BATCH, Tiny, batches
from stats_overhead import small_cnn
from torch import nn

from hookscope.doctor.engine import CHECK_EVERY
from hookscope.doctor.timing import TimingRecorder

VARIANT = "+ TimingRecorder"


def feed(model: nn.Module, opt: torch.optim.Optimizer) -> TimingRecorder:
    """A TimingRecorder fed from the optimizer's hooks, as hs.watch feeds the engine."""
    recorder = TimingRecorder()
    recorder.attach(model)
    return feed_from_optimizer(recorder, opt)


def train(
    build: Callable[[], nn.Module], data: list, steps: int, clock: Callable[[], float], timed: bool
) -> float:
    """Seconds per step of a plain loop, bare or feeding a TimingRecorder."""
    model = build()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    recorder = feed(model, opt) if timed else None
    loss_fn = nn.CrossEntropyLoss()
    start = clock()
    for i in range(steps):
        x, y = data[i % len(data)]
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        if recorder is not None:
            recorder.log_loss(loss, training=True)
        loss.backward()
        opt.step()
    if recorder is not None:
        recorder.close()
        recorder.findings()
    return (clock() - start) / steps


def feed_calls(steps: int, checks: bool) -> float:
    """Seconds per step of the recorder's feed calls alone, as its hooks and the loop make them."""
    model, loss = nn.Linear(2, 2), torch.zeros(())
    recorder = TimingRecorder()
    recorder.attach(model)
    recorder.begin_batch(0, training=True)
    start = time.thread_time()
    for step in range(steps):
        recorder._forward_starts(model, ())
        recorder._forward_ends(model, (), loss)
        recorder.log_loss(loss, training=True)
        recorder.gradients_ready()
        recorder.step_done()
        recorder.end_batch()
        if checks and (step + 1) % CHECK_EVERY == 0:
            recorder.findings()
        recorder.begin_batch(step + 1, training=True)
    seconds = (time.thread_time() - start) / steps
    recorder.close()
    return seconds


def steady_malloc() -> None:
    """Fix glibc's mmap and trim thresholds (64 MB, 256 MB): no moving allocator state between variants."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL("libc.so.6")
    m_trim_threshold, m_mmap_threshold = -1, -3
    libc.mallopt(m_mmap_threshold, 64 << 20)
    libc.mallopt(m_trim_threshold, 256 << 20)


def main() -> None:
    args = benchmark_args(__doc__.splitlines()[0])
    steady_malloc()
    torch.set_num_threads(1)
    rounds = 1 if args.quick else args.rounds
    data = batches(50)
    runs = {
        "small CNN": (small_cnn, 20 if args.quick else 300),
        "near-empty model": (Tiny, 50 if args.quick else 2000),
    }
    us = {}
    for name, (build, steps) in runs.items():
        variants = {
            "plain loop": lambda b=build, n=steps: train(b, data, n, CLOCKS[args.clock], timed=False),
            VARIANT: lambda b=build, n=steps: train(b, data, n, CLOCKS[args.clock], timed=True),
        }
        times = run_alternating(variants, rounds)
        us[name] = {variant: median(values) * 1e6 for variant, values in times.items()}
        title = f"{name}, batch {BATCH}, {steps} steps, {rounds} rounds, {args.clock} clock"
        print(format_table(title, us[name], "plain loop"))
        print(f"  median paired ratio {paired_ratio(times, VARIANT, 'plain loop'):.4f}x")
    extra = us["near-empty model"][VARIANT] - us["near-empty model"]["plain loop"]
    cnn_step = us["small CNN"]["plain loop"]
    print(f"the recorder's own cost: {extra:.1f} µs per step = {extra / cnn_step:.2%} of a small CNN step")
    steps = 500 if args.quick else 5000
    alone = {checks: median([feed_calls(steps, checks) for _ in range(rounds)]) * 1e6 for checks in (0, 1)}
    print(
        f"its feed calls alone (thread CPU time): {alone[0]:.1f} µs per step, "
        f"{alone[1]:.1f} µs with the checks"
    )


if __name__ == "__main__":
    main()
