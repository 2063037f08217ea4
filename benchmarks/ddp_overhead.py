"""Per-step cost of a 2-process DDP loop on CPU (gloo): hand-written vs hookscope's Learner vs Lightning.

The MLP of loop_overhead.py (32 -> 64 -> 10, where the loop's own cost shows), batch 64 per rank, SGD, one
thread per rank. Every variant wraps the model in DistributedDataParallel and shards a shuffled
DataLoader with a DistributedSampler (Lightning and the Learner do both themselves); each rank runs
WARMUP + STEPS batches of one epoch and rank 0 times the STEPS steps after the warm-up. Variants alternate
in the same two processes (one process group, created by this script); the median over rounds is
reported as µs per step and as a ratio to the hand-written loop. Run it as a plain script — it starts
torchrun itself: python benchmarks/ddp_overhead.py [--quick] [--rounds N] [--clock cpu]
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

sys.path.insert(0, str(Path(__file__).parent))
import loop_overhead
from common import CLOCKS, benchmark_args, format_table, median, optional_import, run_alternating
from loop_overhead import BATCH, LR, hand_written, hookscope, lightning_variant, mlp

WORLD = 2


class Setup(loop_overhead.Setup):
    """loop_overhead's MLP setup with enough shuffled samples for WARMUP + STEPS batches on each rank."""

    def __init__(self, warmup: int, steps: int, clock_name: str) -> None:
        super().__init__(mlp, (32,), warmup * WORLD, steps * WORLD, CLOCKS[clock_name])
        self.warmup, self.steps = warmup, steps  # per rank: what StepClock marks


class WrappedSetup(Setup):
    """The same data, and the model already in ``DistributedDataParallel``, for the hand-written loop."""

    def model_and_opt(self) -> tuple[nn.Module, torch.optim.Optimizer]:
        model, _ = super().model_and_opt()
        model = DistributedDataParallel(model)
        return model, torch.optim.SGD(model.parameters(), lr=LR)

    def sharded_loader(self) -> DataLoader:
        """The DDP tutorial's loader: a DistributedSampler over the dataset, epoch 0."""
        dataset = self.loader().dataset
        sampler = DistributedSampler(dataset, shuffle=True, seed=0)
        sampler.set_epoch(0)
        return DataLoader(dataset, batch_size=BATCH, sampler=sampler)


def hand_written_ddp(setup: WrappedSetup) -> float:
    """loop_overhead's hand-written loop, on the wrapped model and the sharded loader."""
    return hand_written(setup, setup.sharded_loader)


def on_every_rank(variant: functools.partial) -> float:
    """Start every rank's run together; rank 0's time is the one reported."""
    dist.barrier()
    return variant()


def worker(args: SimpleNamespace) -> None:
    """One rank under torchrun: all variants, alternating; rank 0 prints the table."""
    warnings.filterwarnings("ignore")  # peers' deprecation notices
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    warmup, steps, rounds = (5, 30, 1) if args.quick else (30, 300, args.rounds)
    setup, wrapped = Setup(warmup, steps, args.clock), WrappedSetup(warmup, steps, args.clock)
    variants = {
        "hand-written DDP, DataLoader": functools.partial(hand_written_ddp, wrapped),
        "hookscope Learner (in_memory=False)": functools.partial(hookscope, setup, in_memory=False),
        "hookscope Learner (in-memory fast path)": functools.partial(hookscope, setup, in_memory=True),
    }
    skipped: dict[str, str] = {}
    found, reason = optional_import("lightning")
    if found is None:
        skipped["Lightning Trainer(strategy='ddp')"] = reason
    else:
        lightning = functools.partial(lightning_variant, setup, strategy="ddp", devices=WORLD)
        variants["Lightning Trainer(strategy='ddp')"] = lightning
    times = run_alternating(
        {name: functools.partial(on_every_rank, v) for name, v in variants.items()}, rounds
    )
    if dist.get_rank() == 0:
        per_step = {name: median(t) / steps * 1e6 for name, t in times.items()}
        title = (
            f"{WORLD} processes, gloo, MLP 32-64-10, batch {BATCH}/rank, {args.clock} clock, {rounds} rounds"
        )
        print(format_table(title, per_step, baseline="hand-written DDP, DataLoader", skipped=skipped))
    dist.destroy_process_group()


def main() -> None:
    args = benchmark_args(__doc__.splitlines()[0])
    if "LOCAL_RANK" in os.environ:
        worker(args)
        return
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([*command, __file__, *sys.argv[1:]], env=env, check=False)
    sys.exit(done.returncode)


if __name__ == "__main__":
    main()
