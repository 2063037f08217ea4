"""Lightning's FSDP2 strategy (``ModelParallelStrategy``) on 2 CPU processes with hookscope's callback.

Lightning starts the second process itself (it runs this script again); each rank writes its findings to
``<out>/rank<r>.pt``. The model is ``faults.dead_mlp`` sharded per Linear layer, then at the root.
"""

from __future__ import annotations

import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/faults.py

import faults

from hookscope.integrations.lightning import HookscopeCallback


class Sharded(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = faults.dead_mlp()

    def configure_model(self) -> None:
        mesh = self.device_mesh["data_parallel"]
        for layer in self.net:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(self.net, mesh=mesh)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main() -> None:
    out = Path(sys.argv[1])
    callback = HookscopeCallback(quiet=True, check_every=3)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1),
        max_steps=8,
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Sharded(), faults.digits_flat().train)
    out.mkdir(parents=True, exist_ok=True)
    findings = [(f.kind, f.module, f.step) for f in callback.findings]
    torch.save({"findings": findings}, out / f"rank{trainer.global_rank}.pt")


if __name__ == "__main__":
    main()
