"""The doctor on a model of real size: GPT-2 small (124 M parameters, 12 blocks, 125 watched modules) on CPU.

The model is built from a transformers config (``GPT2Config()``'s defaults: n_layer=12, n_embd=768, n_head=12;
random weights, nothing downloaded) and trained with AdamW at 1e-4 on random tokens, batch 2 x 128 tokens,
in a hand-written loop. Measured:

- attach time: ``hs.watch(model, opt)`` (hooks on every watched module, the optimizer's hooks) and the
  doctor's engine alone (``Engine().attach``: what ``Doctor`` does in ``before_fit``), median over rounds;
- cost per step at the defaults: the same 40 steps bare and under ``hs.watch(model, opt, quiet=True)``,
  alternating, the median of the paired ratios (target <= 1.05x). Forty steps hold the doctor's warm-up
  (its first 5 steps recorded), so this is the cost of a short run; each step is also timed
  against the bare step at the same place in the round, recorded and unrecorded apart, and the default
  schedule (every step of the first 5, then every 50th) turns the two into the cost of runs of 100,
  1,000 and 10,000 steps;
- the memory the doctor's histories hold, per module, measured after the run, against the bound the code
  sets whatever the run's length: ``history`` (1000) records per module for activations and for output
  gradients — a history holding more is thinned to half — each record a histogram of ``bins`` (50) int64
  counts, one float64 per channel (dim 1 of the output: the 128 positions here) and ~0.5 KB of fields;
- the report: ``report.html`` written at close, its size and how many modules it covers.

    python benchmarks/big_model.py [--quick] [--rounds N] [--clock cpu]

``--quick`` uses a 2-block, 64-wide GPT-2 to check that the script runs; figures come from the full model
on a quiet machine.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from common import CLOCKS, benchmark_args, format_table, median, paired_ratio, run_alternating

import hookscope as hs
from hookscope.doctor.engine import Engine
from hookscope.doctor.recorders import ActivationRecorder
from hookscope.doctor.schedule import RecordingSchedule

LR = 1e-4
BATCH, TOKENS = 2, 128
STEPS = 40  # per round: the doctor's 5 recorded warm-up steps, then 35 it does not record
# Bytes of one history record besides its arrays: the StepStats and TensorStats objects, their boxed
# numbers and two ndarray headers (measured with sys.getsizeof on CPython 3.11: ~0.5 KB).
RECORD_FIELDS = 512


def gpt2(quick: bool) -> torch.nn.Module:
    """GPT-2 small from its config (random weights), or a 2-block, 64-wide one with ``quick``."""
    from transformers import GPT2Config, GPT2LMHeadModel

    tiny = {"n_layer": 2, "n_embd": 64, "n_head": 2, "vocab_size": 1000, "bos_token_id": 0, "eos_token_id": 0}
    config = GPT2Config(**tiny) if quick else GPT2Config()
    torch.manual_seed(0)
    return GPT2LMHeadModel(config)


def batches(model: torch.nn.Module, steps: int, tokens: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    return [torch.randint(0, vocab, (BATCH, tokens), generator=generator) for _ in range(steps)]


def loop(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    data: list[torch.Tensor],
    watch=None,
    clock: Callable[[], float] = time.perf_counter,
) -> list[float]:
    """Train one step per batch of ``data``; returns each step's seconds."""
    seconds = []
    for ids in data:
        start = clock()
        logits = model(input_ids=ids).logits
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
        if watch is not None:
            watch.log(loss)
        loss.backward()
        opt.step()
        opt.zero_grad()
        seconds.append(clock() - start)
    return seconds


def timed_steps(
    model, opt, data, clock: Callable[[], float], watched: bool, attach: list[float], each: dict
) -> float:
    """Seconds per step of the loop over ``data``, bare or under ``hs.watch`` (its attach time appended
    to ``attach``; attaching and the closing check are outside the step figure). Each step's seconds go
    to ``each`` by its place in the round: under "bare", or "recorded" / "unrecorded" (whether the doctor
    took statistics of it)."""
    watch = None
    if watched:
        start = time.perf_counter()
        watch = hs.watch(model, opt, quiet=True)
        attach.append(time.perf_counter() - start)
    per_step = loop(model, opt, data, watch, clock)
    if watch is None:
        for place, seconds in enumerate(per_step):
            each.setdefault("bare", {}).setdefault(place, []).append(seconds)
        return sum(per_step) / len(data)
    watch.close()
    recorded = {record.step for records in watch.activations.values() for record in records}
    for place, seconds in enumerate(per_step):
        kind = "recorded" if place in recorded else "unrecorded"
        each.setdefault(kind, {}).setdefault(place, []).append(seconds)
    return sum(per_step) / len(data)


def schedule_lines(each: dict[str, dict[int, list[float]]]) -> list[str]:
    """The cost of a step the doctor records and of one it does not, each against the bare step at the
    same place in the round (the first steps of a round are slower), and what the default schedule
    makes of them over runs of several lengths."""
    if "unrecorded" not in each or "recorded" not in each:
        return ["  (too few steps per round to tell recorded from unrecorded steps)"]
    bare = {place: median(seconds) for place, seconds in each["bare"].items()}

    def ratio(kind: str) -> tuple[float, int]:
        ratios = [s / bare[place] for place, seconds in each[kind].items() for s in seconds]
        return median(ratios), len(ratios)

    (recorded, n_recorded), (unrecorded, n_unrecorded) = ratio("recorded"), ratio("unrecorded")
    lines = [
        f"  per step, against the bare step at the same place: recorded {recorded:.3f}x ({n_recorded} "
        f"steps), not recorded {unrecorded:.3f}x ({n_unrecorded} steps)"
    ]
    for n in (100, 1_000, 10_000):
        kept = sum(map(RecordingSchedule(), range(n)))  # the default schedule, nothing suspicious
        lines.append(
            f"  a run of {n:,} steps at that schedule ({kept} recorded): "
            f"{(kept * recorded + (n - kept) * unrecorded) / n:.3f}x"
        )
    return lines


def engine_attach(model: torch.nn.Module) -> float:
    start = time.perf_counter()
    engine = Engine(quiet=True)
    engine.attach(model)
    seconds = time.perf_counter() - start
    engine.close()
    return seconds


def record_bytes(records: list) -> int:
    """Bytes a module's history holds: each record's arrays and its fixed part (histogram edges are
    shared by every record, so not counted)."""
    return sum(r.stats.histogram.nbytes + r.stats.channel_rms.nbytes + RECORD_FIELDS for r in records)


def bound_per_module(history: int, bins: int, channels: int) -> int:
    """The most a module's activation and output-gradient histories hold together, whatever the run."""
    return 2 * (history + 1) * (bins * 8 + channels * 8 + RECORD_FIELDS)


def memory_lines(watch: hs.Watch, tokens: int) -> list[str]:
    histories = [watch.activations, watch.gradients]
    per_module = [sum(record_bytes(h.get(name, [])) for h in histories) for name in watch.activations]
    records = max(len(r) for r in watch.activations.values())
    recorder = ActivationRecorder()  # the defaults hs.watch and the Doctor record with
    bound = bound_per_module(recorder.max_history, recorder.bins, tokens)
    return [
        f"doctor histories: {len(per_module)} modules, {records} records each after this run; "
        f"{np.mean(per_module) / 1e3:.1f} kB per module on average, {max(per_module) / 1e3:.1f} kB at most",
        f"  bound whatever the run length: {bound / 1e6:.2f} MB per module "
        f"(2 x {recorder.max_history + 1} records x ({recorder.bins} bins + {tokens} channels) x 8 B "
        f"+ {RECORD_FIELDS} B), {bound * len(per_module) / 1e9:.2f} GB for the {len(per_module)} modules",
    ]


def main() -> None:
    args = benchmark_args(__doc__.splitlines()[0])
    steps = 2 if args.quick else STEPS
    rounds = 1 if args.quick else args.rounds
    tokens = 16 if args.quick else TOKENS
    clock = CLOCKS[args.clock]
    model = gpt2(args.quick)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    data = batches(model, steps, tokens)
    params = sum(p.numel() for p in model.parameters())
    print(f"GPT-2: {params / 1e6:.1f} M parameters, {model.config.n_layer} blocks, batch {BATCH} x {tokens}")
    loop(model, opt, data[:1])  # warm-up: the optimizer's state, the allocator

    attach: list[float] = []
    each: dict[str, dict[int, list[float]]] = {}
    variants = {
        "bare loop": lambda: timed_steps(model, opt, data, clock, False, attach, each),
        "hs.watch (defaults)": lambda: timed_steps(model, opt, data, clock, True, attach, each),
    }
    times = run_alternating(variants, rounds)
    per_step = {name: median(values) * 1e6 for name, values in times.items()}
    print(
        format_table(f"{steps} steps per round, {rounds} rounds ({args.clock} clock)", per_step, "bare loop")
    )
    print(f"  paired ratio: {paired_ratio(times, 'hs.watch (defaults)', 'bare loop'):.3f}x")
    for line in schedule_lines(each):
        print(line)
    engine = median([engine_attach(model) for _ in range(rounds)])
    print(f"attach: hs.watch {median(attach) * 1e3:.0f} ms, the doctor's engine {engine * 1e3:.0f} ms")

    with tempfile.TemporaryDirectory() as folder:
        watch = hs.watch(model, opt, quiet=True, path=Path(folder) / "run")
        loop(model, opt, data, watch)
        watch.close()
        for line in memory_lines(watch, tokens):
            print(line)
        report = Path(folder) / "run" / "report.html"
        size = report.stat().st_size if report.is_file() else 0
        print(f"report: {size / 1e3:.0f} kB for {len(watch.activations)} watched modules")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
