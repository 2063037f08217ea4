"""What it costs to look for a NaN/Inf, and who gets blamed: find_nonfinite vs torch.autograd.detect_anomaly.

Timed variants on ResNet18 (``weights=None``, train mode, batch 8, 3x224x224 by default, CPU, one thread),
run alternating in the same process, medians over rounds, one forward + cross-entropy + backward each:

- ``plain forward+backward`` (baseline);
- ``find_nonfinite`` on the same healthy batch: one device flag per module call and one host read at
  the end; its gradients come from ``torch.autograd.grad``, the model is left as found;
- ``forward+backward under detect_anomaly``.

Then the blame, on a small model whose forward makes a NaN with ``sqrt`` of a negative value: what
``find_nonfinite`` names (module, phase, op) and what ``detect_anomaly`` names (it checks the backward only,
so its error points at the backward of whatever op first meets the NaN there).
Target: find_nonfinite at most 1.2x the plain step.

    python benchmarks/nonfinite_vs_anomaly.py            # full run
    python benchmarks/nonfinite_vs_anomaly.py --quick    # smoke test (64x64 images, 2 rounds)
"""

from __future__ import annotations

import contextlib
import re
import time
import warnings
from collections.abc import Callable, Iterator

import torch
from common import CLOCKS, benchmark_args, format_table, median, run_alternating  # benchmarks/
from torch import nn
from torchvision.models import resnet18

import hookscope as hs


def timed(clock: Callable[[], float], body: Callable[[], object]) -> Callable[[], float]:
    def run() -> float:
        start = clock()
        body()
        return clock() - start

    return run


class SqrtAct(nn.Module):
    """sqrt of a value that is negative for half the inputs: a forward NaN."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sqrt(x)


def blame_comparison() -> tuple[str, str]:
    """(what find_nonfinite says, what detect_anomaly says) for a forward sqrt NaN."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), SqrtAct(), nn.Linear(32, 4), nn.Tanh(), nn.Linear(4, 3))
    x, y = torch.randn(8, 16), torch.randint(0, 3, (8,))
    report = hs.find_nonfinite(model, x, nn.CrossEntropyLoss(), y)
    ours = f"module `{report.module}` ({report.module_type}), phase {report.phase}, op {report.op}"
    try:
        with quiet_anomaly():
            nn.CrossEntropyLoss()(model(x), y).backward()
        theirs = "no error raised"
    except RuntimeError as exc:
        match = re.search(r"Function '(\w+)'", str(exc))
        theirs = f"backward node {match.group(1) if match else str(exc)[:80]} (no module, no forward op)"
    return ours, theirs


@contextlib.contextmanager
def quiet_anomaly() -> Iterator[None]:
    """detect_anomaly without its "will increase the runtime" warning and forward-trace printouts."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.autograd.detect_anomaly():
            yield


def main() -> None:
    args = benchmark_args(__doc__.splitlines()[0])
    size, rounds = (64, 2) if args.quick else (224, args.rounds)
    torch.set_num_threads(1)  # steadier on a shared machine, and what --clock cpu (this thread) measures
    torch.manual_seed(0)
    model = resnet18(weights=None).train()
    x, y = torch.randn(8, 3, size, size), torch.randint(0, 1000, (8,))
    loss_fn = nn.CrossEntropyLoss()
    clock = CLOCKS[args.clock]

    def plain() -> None:
        model.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()

    def anomaly() -> None:
        model.zero_grad(set_to_none=True)
        with quiet_anomaly():
            loss_fn(model(x), y).backward()

    def find() -> None:
        report = hs.find_nonfinite(model, x, loss_fn, y)
        assert not report.found, report

    variants = {
        "plain forward+backward": timed(clock, plain),
        "find_nonfinite": timed(clock, find),
        "forward+backward under detect_anomaly": timed(clock, anomaly),
    }
    for run in variants.values():
        run()  # warm-up: allocator, kernels
    times = run_alternating(variants, rounds)
    per_step_us = {name: median(values) * 1e6 for name, values in times.items()}
    title = (
        f"ResNet18, batch 8, 3x{size}x{size}, CPU, {torch.get_num_threads()} threads, "
        f"median of {rounds} rounds ({args.clock} clock)"
    )
    print(format_table(title, per_step_us, baseline="plain forward+backward"))
    ours, theirs = blame_comparison()
    print("Forward NaN made by sqrt of a negative value in module `1`:")
    print(f"  find_nonfinite blames: {ours}")
    print(f"  detect_anomaly blames: {theirs}")


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"(benchmark took {time.perf_counter() - start:.0f} s)")
