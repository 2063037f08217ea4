"""FSDP1 (``FullyShardedDataParallel``) on 2 CPU processes (gloo), under torchrun: ``hs.watch`` and the
Learner refuse it.

The model is ``faults.dead_mlp`` with every Linear wrapped (``use_orig_params=True``, an auto-wrap policy),
then the root; ``device_id`` CPU, without which FSDP1 asks for an accelerator. Each rank tries ``hs.watch``
on the wrapped model and on the user's module inside the root wrapper, and a Learner on the wrapped model
(under torchrun it would wrap it in DDP, whose broadcast fails on slices of different sizes), and writes
the error messages to ``<out>/rank<r>.pt``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/faults.py

import faults

import hookscope as hs


def refusal(model: nn.Module) -> str:
    try:
        hs.watch(model, quiet=True).close()
    except TypeError as err:
        return str(err)
    return ""


def learner_refusal(model: nn.Module) -> str:
    data = torch.utils.data.TensorDataset(torch.randn(8, 16), torch.randint(0, 4, (8,)))
    try:
        hs.Learner(model, (torch.utils.data.DataLoader(data, batch_size=4), None), nn.CrossEntropyLoss())
    except TypeError as err:
        return str(err)
    return ""


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    policy = ModuleWrapPolicy({nn.Linear})
    options = dict(use_orig_params=True, auto_wrap_policy=policy, device_id=torch.device("cpu"))
    model = FullyShardedDataParallel(faults.dead_mlp(), **options)
    messages = [refusal(model), refusal(model.module), learner_refusal(model)]
    hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.module.modules())
    torch.save({"messages": messages, "hooks": hooks}, out / f"rank{dist.get_rank()}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
