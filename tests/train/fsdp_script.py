"""A hand-written loop under ``hs.watch`` that the FSDP2 tests run in one process or under torchrun.

Under torchrun the model is sharded with ``fully_shard`` (each Linear, then the root) and each of the 2
ranks takes every other sample of a batch, so together they see the batch one process sees whole. Each
rank writes ``<out>/<model>/rank<r>.pt`` for each of the ``--models`` (trained one after the other): the
findings, the gradient norms and update ratios per parameter, the last activation statistics per layer,
and whether the guard stopped the run.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/faults.py

import faults

import hookscope as hs
from hookscope.watching import NonFiniteError

MODELS = {"dead": faults.dead_mlp, "exploding": faults.exploding_mlp, "plain": lambda: faults.mlp(depth=3)}


def shard(model: nn.Module) -> None:
    """FSDP2 on each Linear, then the root (the policy torchtitan uses for blocks)."""
    from torch.distributed.fsdp import fully_shard

    for module in model.modules():
        if isinstance(module, nn.Linear):
            fully_shard(module)
    fully_shard(model)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=["dead"])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--nan-at", type=int, help="make the inputs NaN from this step on (the guard stops)")
    args = parser.parse_args()

    rank, world = 0, 1
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    for name in args.models:  # one after the other: a launch (torch's import, the group) costs more
        result = train(MODELS[name], args.steps, args.nan_at, rank, world)
        (args.out / name).mkdir(parents=True, exist_ok=True)
        torch.save(result, args.out / name / f"rank{rank}.pt")
    if world > 1:
        # no rank tears down the group while its peer still talks to it; not gloo's barrier(), whose
        # worker thread can free FSDP2's last all-gather after the interpreter began to finalize (abort)
        dist.monitored_barrier()
        dist.destroy_process_group()


def train(build: Callable[[], nn.Module], steps: int, nan_at: int | None, rank: int, world: int) -> dict:
    """``steps`` steps of the model ``build`` makes under ``hs.watch``, the inputs NaN from ``nan_at``."""
    torch.manual_seed(0)
    model = build()
    if world > 1:
        shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_func = nn.CrossEntropyLoss()
    stopped = None
    w = hs.watch(model, opt, quiet=True, check_every=3, guard=nan_at is not None)
    try:
        with w:
            for x, y in faults.digits_flat().train:
                if w.step >= steps:
                    break
                if nan_at is not None and w.step >= nan_at:
                    x = torch.full_like(x, float("nan"))
                loss = loss_func(model(x[rank::world]), y[rank::world])
                w.log(loss)
                loss.backward()
                opt.step()
                opt.zero_grad()
    except NonFiniteError as err:
        stopped = (err.step, err.reason)
    return {
        "findings": [(f.kind, f.module, f.step, f.severity) for f in w.findings],
        "params": {
            name: [(r.step, r.grad_norm, r.update_ratio) for r in records]
            for name, records in w.param_history.items()
        },
        "stats": {
            name: (
                records[-1].stats.count,
                records[-1].stats.mean,
                records[-1].stats.std,
                records[-1].stats.histogram,
            )
            for name, records in w.activations.items()
            if records
        },
        "stopped": stopped,
    }


if __name__ == "__main__":
    main()
