"""Cost of the doctor's timing (:class:`hookscope.doctor.timing.TimingRecorder`) per training step.

A plain loop trains a small CNN (two conv blocks and a linear head): 1x28x28 random images, batch 64,
AdamW, CPU, one thread, 300 steps. Bare, and with the recorder fed as ``hs.watch`` feeds the engine:
its own forward pre/post hooks on the model's root, the optimizer's step pre/post hooks (gradients
ready, step done, end of batch, next batch), the loss logged every step, the rules every
``hookscope.doctor.engine.CHECK_EVERY`` (20) steps.
Variants alternate over rounds; the table gives the median per-step time and the median of per-round
ratios with its 95% interval (distribution-free: ``common.median_interval``). Target: at most 1.02x.

Each fit builds its model and optimizer anew, so two fits differ in where their tensors sit and in the
machine's spell: on a busy 2-core machine that interval spans 10 points or more, wider than the target.
The one-fit table trains one model in blocks of 50 steps, the recorder fed in one block of each pair
and not in the other (the order alternating), so both halves of a pair share the allocator's state and
the machine's spell of a few seconds: its median ratio has an interval a few points wide, which says
whether the cost is below 1.02x. Each fed block attaches the recorder again, so its memory reads start
dense again (more reads than a run makes: that figure errs high).

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
    python benchmarks/timing_overhead.py --clock cpu --pairs 120   # a narrower one-fit interval
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
    median_interval,
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
    feed_from_optimizer(recorder, opt)
    return recorder


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


def blocks(
    build: Callable[[], nn.Module], data: list, pairs: int, block: int, clock: Callable[[], float]
) -> list[float]:
    """Per-pair ratios, fed block over bare, of one model trained in blocks of ``block`` steps (the
    one-fit table of the module's docstring); a fed block's last flush is timed, its attaching and
    detaching are not."""
    model = build()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn, recorder, step = nn.CrossEntropyLoss(), TimingRecorder(), 0

    def run(timed: bool) -> float:
        nonlocal step
        handles = []
        if timed:
            recorder.attach(model)
            handles = feed_from_optimizer(recorder, opt, first_step=step)
        start = clock()
        for _ in range(block):
            x, y = data[step % len(data)]
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            if timed:
                recorder.log_loss(loss, training=True)
            loss.backward()
            opt.step()
            step += 1
        if timed:
            recorder.flush()
        seconds = clock() - start
        for handle in handles:
            handle.remove()
        if timed:
            recorder.fail()  # the hooks off until the next fed block
        return seconds

    run(timed=False)  # warm-up: the first steps allocate and load what later ones reuse
    ratios = []
    for pair in range(pairs):
        first = run(timed=pair % 2 == 0)
        second = run(timed=pair % 2 == 1)
        ratios.append(first / second if pair % 2 == 0 else second / first)
    recorder.close()
    return ratios


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
    args = benchmark_args(
        __doc__.splitlines()[0], counts={"--pairs": (60, "pairs of blocks in the one-fit table")}
    )
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
        ratios = [a / b for a, b in zip(times[VARIANT], times["plain loop"], strict=True)]
        low, high = median_interval(ratios)
        print(f"  median paired ratio {median(ratios):.4f}x, 95% interval {low:.4f}-{high:.4f}x")
    pairs, block = (4, 10) if args.quick else (args.pairs, 50)
    ratios = blocks(small_cnn, data, pairs, block, CLOCKS[args.clock])
    low, high = median_interval(ratios)
    print(
        f"small CNN in one fit, the recorder fed in every other block of {block} steps ({pairs} pairs): "
        f"median paired ratio {median(ratios):.4f}x, 95% interval {low:.4f}-{high:.4f}x"
    )
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
