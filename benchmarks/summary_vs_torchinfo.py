"""Time hs.summary against torchinfo.summary on ResNet34 with a 1x3x224x224 input, in the same process.

Both run the same real CPU forward (random weights) plus their own bookkeeping; runs alternate so that
machine noise hits both alike, and the medians of wall time and of process CPU time are reported (CPU time
is the steadier figure on a shared machine). Also reports hs.summary with device="meta" (shapes and MACs
without computing anything). Usage: python benchmarks/summary_vs_torchinfo.py [--repeats N] [--threads T]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torchinfo
from torchvision.models import resnet34

import hookscope as hs


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15, help="timed runs of each tool (after one warm-up)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    model = resnet34(weights=None).eval()
    size = (1, 3, 224, 224)
    tools: dict[str, Callable[[], object]] = {
        "torchinfo.summary": lambda: torchinfo.summary(model, input_size=size, verbose=0),
        "hs.summary": lambda: hs.summary(model, input_size=size),
        "hs.summary(device='meta')": lambda: hs.summary(model, input_size=size, device="meta"),
    }
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in tools}
    for fn in tools.values():
        fn()
    for _ in range(args.repeats):
        for name, fn in tools.items():
            times[name].append(timed(fn))

    ours = hs.summary(model, input_size=size)
    theirs = torchinfo.summary(model, input_size=size, verbose=0)
    medians = {
        name: [statistics.median(s[i] for s in samples) for i in (0, 1)] for name, samples in times.items()
    }
    base_wall, base_cpu = medians["torchinfo.summary"]
    print(f"ResNet34 {size}, torch threads {torch.get_num_threads()}, {args.repeats} runs each, medians:")
    for name, (wall, cpu) in medians.items():
        print(
            f"  {name:28s} wall {wall * 1e3:7.1f} ms ({wall / base_wall:.2f}x torchinfo)  "
            f"cpu {cpu * 1e3:7.1f} ms ({cpu / base_cpu:.2f}x)"
        )
    print(f"  params: hs {ours.total_params:,}  torchinfo {theirs.total_params:,}")
    print(f"  MACs:   hs {ours.total_macs / 1e9:.4f} G  torchinfo {theirs.total_mult_adds / 1e9:.4f} G")


if __name__ == "__main__":
    main()
