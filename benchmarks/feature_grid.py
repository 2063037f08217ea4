"""Feature-map grid: time to draw and save one 64-map grid of a (1, 64, 112, 112) activation.

This is what ``hookscope inspect`` does per layer (ResNet18's ``conv1`` output has this shape): build the
figure with ``hs.viz.feature_maps(..., max_maps=64, title=...)`` and write it with ``hs.viz.save_figure``
at 60 dpi. Each round draws and saves one grid; the median over rounds is reported. The first grid, which
also pays for importing matplotlib, is timed apart. The clock is wall time; ``--clock cpu`` (this thread's
CPU time, with ``OMP_NUM_THREADS=1``) is steadier when other processes share the cores.

Compare two versions by running the script against each checkout's source:

    .venv/bin/python benchmarks/feature_grid.py                                   # this checkout
    git worktree add --detach /tmp/before d9047d1                                 # before one-image grids
    PYTHONPATH=/tmp/before/src .venv/bin/python benchmarks/feature_grid.py        # the other one
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/feature_grid.py --clock cpu     # on a busy machine
    .venv/bin/python benchmarks/feature_grid.py --quick                           # smoke test (2 rounds)

Target: well under a second per grid on the project's 2-core CPU machine.
"""

from __future__ import annotations

import platform
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from common import CLOCKS, benchmark_args, median  # benchmarks/, the script's folder

import hookscope as hs

SHAPE = (1, 64, 112, 112)
TARGET_S = 1.0


def draw_and_save(activation: torch.Tensor, path: Path, clock: Callable[[], float]) -> float:
    """Seconds to draw one grid of the first 64 maps and save it as a 60-dpi PNG, as ``inspect`` does."""
    start = clock()
    fig = hs.viz.feature_maps(activation, max_maps=64, title="conv1: 64 of 64 channels")
    hs.viz.save_figure(fig, path, dpi=60)
    return clock() - start


def main() -> None:
    args = benchmark_args(__doc__.splitlines()[0])
    rounds = 2 if args.quick else args.rounds
    activation = torch.randn(SHAPE, generator=torch.Generator().manual_seed(0))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "grid.png"
        first = draw_and_save(activation, path, CLOCKS[args.clock])
        times = [draw_and_save(activation, path, CLOCKS[args.clock]) for _ in range(rounds)]
        size_kb = path.stat().st_size / 1024
    print(f"hookscope from {Path(hs.__file__).parent}; {platform.machine()}, torch {torch.__version__}")
    print(f"{args.clock} clock; grid of {SHAPE}: first {first:.3f} s (matplotlib import included), ", end="")
    print(f"median {median(times):.3f} s over {rounds} rounds, PNG {size_kb:.0f} KiB")
    print(f"target < {TARGET_S:.1f} s: {'met' if median(times) < TARGET_S else 'NOT met'}")


if __name__ == "__main__":
    main()
