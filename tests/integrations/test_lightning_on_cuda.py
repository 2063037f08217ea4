"""hookscope's Lightning callback on a GPU adds no host sync to a training step.

Lightning may synchronise on its own (copying each batch from pageable memory, say), so a fit with the
callback is compared with the same fit without it: the syncs of optimizer steps 21 to 28 (neither
recorded, nor checked, nor sampled by ``host_syncs``; see ``tests/test_watching_on_cuda.py``), by the
file and line that made them, must be the same.
"""

from collections import Counter

import lightning.pytorch as pl
import pytest
import torch
from cuda_syncs import FIRST, LAST, SyncWindow, small_cnn
from loops import LitClassifier
from torch.utils.data import DataLoader, TensorDataset

from hookscope.integrations.lightning import HookscopeCallback

pytestmark = pytest.mark.cuda

STEPS, BATCH = 40, 64


class SyncTrap(pl.Callback):
    """The host syncs of optimizer steps ``FIRST`` to ``LAST``; first in the Trainer's callbacks."""

    def __init__(self) -> None:
        self.window = SyncWindow()

    def on_train_batch_start(self, trainer: pl.Trainer, *_: object) -> None:
        if trainer.global_step == FIRST:
            self.window.open()
        elif trainer.global_step == LAST + 1:
            self.window.close()

    def on_train_end(self, *_: object) -> None:
        self.window.close()

    def on_exception(self, *_: object) -> None:
        self.window.close()  # a failed fit leaves neither the debug mode nor the warning filters behind


def syncs_of_a_fit(*callbacks: pl.Callback) -> Counter[tuple[str, int]]:
    """The syncs of steps ``FIRST`` to ``LAST`` of a small CNN trained by Lightning on the GPU."""
    torch.manual_seed(0)
    x, y = torch.randn(BATCH * STEPS, 1, 16, 16), torch.randint(0, 10, (BATCH * STEPS,))
    net = small_cnn()
    trap = SyncTrap()
    trainer = pl.Trainer(
        accelerator="gpu",
        devices=1,
        max_steps=STEPS,
        callbacks=[trap, *callbacks],
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(LitClassifier(net), DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True))
    assert trainer.global_step == STEPS and torch.cuda.get_sync_debug_mode() == 0
    return trap.window.sites


def test_the_callback_adds_no_host_sync_to_a_step():
    callback = HookscopeCallback(quiet=True)
    assert syncs_of_a_fit(callback) == syncs_of_a_fit()
    assert callback.watch.step == STEPS
