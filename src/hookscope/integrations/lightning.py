"""``HookscopeCallback`` for PyTorch Lightning: the doctor and statistics of ``hs.watch`` in a ``Trainer``.

Lightning runs forward and backward inside ``optimizer.step(closure)``, so an optimizer step pre-hook
would see the previous step's gradients. The callback reads them in ``on_before_optimizer_step`` instead:
after the closure, after the ``GradScaler`` unscaled them (``precision="16-mixed"``), before gradient
clipping, once per optimizer step under ``accumulate_grad_batches``. A step post-hook on the optimizer
tells a real step from one the ``GradScaler`` skipped. The loss comes from ``training_step``'s output,
the target from the batch (the last item of a tuple, the ``labels`` of a dict); the run's length, its
batches per epoch and its learning-rate schedulers from the Trainer.

This module is the integration: it imports Lightning (``lightning.pytorch``) when it is imported, and
hookscope never imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from hookscope.integrations._common import WatchCallback, batch_target, missing_framework, scalars

try:
    import lightning.pytorch as pl
except ImportError as err:
    raise missing_framework(__name__, "Lightning") from err


class HookscopeCallback(WatchCallback, pl.Callback):
    """Watches a LightningModule's training with ``hs.watch``: findings print as they appear and are in
    ``.findings`` after ``fit``.

    ``model``: the module to watch and name findings after (default: the LightningModule's only child that
    holds parameters, e.g. ``self.model = net`` gives ``0``/``conv1``, not ``model.0``; see
    :func:`~hookscope.integrations._common.user_model`). ``options`` are those of ``hs.watch``
    (``doctor``, ``stats``, ``guard``, ``late``, ``select``, ``every``, ``check_every``, ``thresholds``,
    ``quiet``, ``path``). After each check (every ``check_every`` optimizer steps) the Trainer's loggers
    get a few numbers under ``hookscope/``: findings per kind, the largest activation and gradient
    magnitudes and the count of non-finite values of the latest record.
    """

    def __init__(self, model: nn.Module | None = None, **options: Any) -> None:
        super().__init__(**options)
        self.model = model
        self._ready = False

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        watch = self._start(pl_module, self.model, trainer.optimizers, trainer.train_dataloader)
        watch.after_check.append(lambda findings: self._log_scalars(trainer))
        self._ready = False
        self._plan(
            _finite(trainer.estimated_stepping_batches),
            _finite(trainer.num_training_batches),
            [config.scheduler for config in trainer.lr_scheduler_configs],
        )

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        self._gradients_ready()
        self._ready = self.watch is not None

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if isinstance(loss, torch.Tensor):
            # Lightning hands back the loss divided by accumulate_grad_batches; the rules want the batch's
            self._log(loss * trainer.accumulate_grad_batches, target=batch_target(batch))
        if self._ready:  # the last micro-batch of an optimizer step
            self._ready = False
            self._step_ended()

    def _log_scalars(self, trainer: pl.Trainer) -> None:
        """Right after a check, which read every pending statistic: this costs no extra host sync."""
        if not trainer.loggers or self.watch is None:
            return
        metrics = scalars(self.watch)
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.close()

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self.close()

    def close(self) -> None:
        """Run the last check and remove every hook (idempotent; ``fit`` calls it at its end). The loggers
        get the checks during the fit, not this last one, run as the fit ends."""
        if self.watch is not None:
            self.watch.after_check.clear()
        super().close()


def _finite(count: float) -> int | None:
    """A count Lightning gives as ``inf`` when it cannot know it (an iterable dataset): None then."""
    return int(count) if count != float("inf") else None
