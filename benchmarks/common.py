"""Timing helpers shared by the benchmarks: alternating rounds, medians, optional peers, a printed table.

Variants are run round-robin (A B C, B C A, C A B, ...) so that a slow spell of a shared machine hits
every variant alike; each variant measures its own time and the median over rounds is reported.
"""

from __future__ import annotations

import argparse
import importlib
import math
import statistics
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from hookscope.doctor.engine import CHECK_EVERY

try:
    import resource
except ImportError:  # Windows: no getrusage; KernelMeter then counts nothing
    resource = None  # type: ignore[assignment]


def benchmark_args(
    description: str, flags: dict[str, str] | None = None, counts: dict[str, tuple[int, str]] | None = None
) -> argparse.Namespace:
    """The common command line: ``--quick`` for a smoke run, ``--rounds N``, ``--clock wall|cpu``; and a
    benchmark's own on/off ``flags`` (``{"--compile": "help"}``) and whole-number ``counts``
    (``{"--cnn-steps": (300, "help")}``: the default and the help)."""
    parser = argparse.ArgumentParser(description=description)
    for flag, text in (flags or {}).items():
        parser.add_argument(flag, action="store_true", help=text)
    for flag, (default, text) in (counts or {}).items():
        parser.add_argument(flag, type=int, default=default, help=f"{text} (default {default})")
    parser.add_argument("--quick", action="store_true", help="tiny settings: checks the script runs")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per variant; the median is reported")
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="wall: elapsed time (report this on a quiet machine); cpu: this thread's CPU time, "
        "steadier when other processes compete for the cores",
    )
    return parser.parse_args()


CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.thread_time}


def optional_import(name: str) -> tuple[ModuleType | None, str]:
    """``(module, "")`` or ``(None, reason)`` when the peer library is not installed or fails to import."""
    try:
        return importlib.import_module(name), ""
    except Exception as exc:  # a broken peer install must not stop the other variants
        return None, f"{name} not importable ({type(exc).__name__}: {exc}); pip install -e '.[bench]'"


def run_alternating(variants: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Run each variant ``rounds`` times, rotating the order every round; each call returns seconds."""
    names = list(variants)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            times[name].append(variants[name]())
    return times


QUIET_FAULTS = 10  # page faults a step: at most this many, a fit ran outside the faulting regime


class KernelMeter:
    """Minor page faults and the kernel's share of the process's CPU time, per call of each variant.

    Why: glibc's ``malloc`` gives freed memory back to the kernel (it trims the top of its heap, or unmaps a
    block it mapped) and faults it in again at the next step's allocations, or not, and a process drifts
    between these regimes from one fit to the next (the small CNN of ``doctor_overhead.py``, bare Learner
    and ``Doctor()`` alike: 0 to 1,700 faults a step, up to a quarter of its CPU time in the kernel). That
    moves a fit by more than the Doctor's whole cost, so a ratio is read with this beside it: rounds whose
    variants ran in different regimes compare the allocator, not the code.
    """

    def __init__(self) -> None:
        self.calls: dict[str, list[tuple[int, float]]] = {}  # per variant: (faults, kernel share) per call

    def wrap(self, variants: dict[str, Callable[[], float]]) -> dict[str, Callable[[], float]]:
        """The same variants, each call also noted here."""
        return {name: self._metered(name, run) for name, run in variants.items()}

    def report(self, steps: int) -> str:
        """A line per variant: the median page faults per step and kernel share, and their range."""
        if resource is None:
            return "  page faults per step: not counted here (no getrusage on this platform)"
        lines = ["  page faults per step, and the kernel's share of the CPU time (medians; ranges):"]
        for name, calls in self.calls.items():
            faults = [f / steps for f, _ in calls]
            shares = [share for _, share in calls]
            spread = f"({min(faults):.0f}-{max(faults):.0f})"
            lines.append(
                f"    {name:<34}{median(faults):>7.0f} faults {spread:<13}{median(shares):>6.1%} kernel "
                f"({min(shares):.1%}-{max(shares):.1%})"
            )
        return "\n".join(lines)

    def quiet_rounds(self, names: list[str], steps: int, limit: float = QUIET_FAULTS) -> list[int]:
        """The rounds in which none of ``names`` took more than ``limit`` page faults a step."""
        rounds = zip(*(self.calls[name] for name in names), strict=True)
        return [r for r, calls in enumerate(rounds) if all(faults / steps <= limit for faults, _ in calls)]

    def _metered(self, name: str, run: Callable[[], float]) -> Callable[[], float]:
        calls = self.calls.setdefault(name, [])

        def metered() -> float:
            if resource is None:
                calls.append((0, 0.0))
                return run()
            before = resource.getrusage(resource.RUSAGE_SELF)
            seconds = run()
            after = resource.getrusage(resource.RUSAGE_SELF)
            cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            kernel = (after.ru_stime - before.ru_stime) / cpu if cpu > 0 else 0.0
            calls.append((after.ru_minflt - before.ru_minflt, kernel))
            return seconds

        return metered


def median(values: list[float]) -> float:
    return statistics.median(values)


def paired_ratio(times: dict[str, list[float]], name: str, baseline: str) -> float:
    """Median over rounds of ``name``'s time over ``baseline``'s in the same round.

    Neighbouring runs share the machine's state, so this is steadier than a ratio of two medians when
    a shared machine speeds up and slows down between rounds.
    """
    return median([a / b for a, b in zip(times[name], times[baseline], strict=True)])


def ratio_spread(times: dict[str, list[float]], name: str, baseline: str) -> str:
    """The middle half of the per-round ratios of ``name`` to ``baseline`` ("1.03-1.08"): on a shared
    machine a round's ratio moves by more than the effects measured, and this says by how much."""
    ratios = sorted(a / b for a, b in zip(times[name], times[baseline], strict=True))
    if len(ratios) < 4:
        return "too few rounds for a spread"
    quartiles = statistics.quantiles(ratios, n=4)
    return f"middle half of the rounds {quartiles[0]:.3f}-{quartiles[2]:.3f}"


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """A distribution-free ``confidence`` interval for the median of ``values``: the order statistics
    that the binomial distribution of values below the median puts around it. Why: a median ratio on a
    shared machine moves between runs by more than the effects measured, and the interval says how far
    one run pins it. With fewer than 6 values there is none at 95%: the smallest and the largest."""
    ordered, n = sorted(values), len(values)
    below, k = 0.0, 0
    for j in range(n // 2):  # widen while P(at most j values below the median) <= (1 - confidence) / 2
        below += math.comb(n, j) / 2**n
        if below > (1 - confidence) / 2:
            break
        k = j + 1
    if k == 0:
        return ordered[0], ordered[-1]
    return ordered[k - 1], ordered[n - k]


def format_table(
    title: str, per_step_us: dict[str, float], baseline: str, skipped: dict[str, str] | None = None
) -> str:
    """A plain-text table: variant, µs per step, ratio to ``baseline``; skipped peers with their reason."""
    lines = [title, f"  {'variant':<38}{'µs/step':>10}{'ratio':>9}"]
    base = per_step_us[baseline]
    for name, us in per_step_us.items():
        lines.append(f"  {name:<38}{us:>10.1f}{us / base:>8.2f}x")
    for name, reason in (skipped or {}).items():
        lines.append(f"  {name:<38}{'skipped':>10}  {reason}")
    return "\n".join(lines)


def feed_from_optimizer(recorder: Any, opt: Any, check_every: int = CHECK_EVERY, first_step: int = 0) -> list:
    """Drive a doctor recorder (attached already) from the optimizer's step hooks, as hs.watch drives the
    engine: gradients read before each step, the step closed after it, the rules every ``check_every``
    steps, counted from ``first_step``. Returns the two hooks' handles (remove them to stop feeding)."""
    state = {"step": first_step}
    recorder.begin_batch(first_step, training=True)

    def stepped(*_: object) -> None:
        recorder.step_done()
        recorder.end_batch()
        state["step"] += 1
        if state["step"] % check_every == 0:
            recorder.findings()
        recorder.begin_batch(state["step"], training=True)

    return [
        opt.register_step_pre_hook(lambda *_: recorder.gradients_ready()),
        opt.register_step_post_hook(stepped),
    ]
