"""``HookscopeCallback`` for PyTorch Lightning: the doctor and statistics of ``hs.watch`` in a ``Trainer``.

Lightning runs forward and backward inside ``optimizer.step(closure)``, so an optimizer step pre-hook
would see the previous step's gradients. The callback reads them in ``on_before_optimizer_step`` instead:
after the closure, after the ``GradScaler`` unscaled them (``precision="16-mixed"``), before gradient
clipping, once per optimizer step under ``accumulate_grad_batches``. A step post-hook on the optimizer
tells a real step from one the ``GradScaler`` skipped. The loss comes from ``training_step``'s output.

This module is the integration: it imports Lightning (``lightning.pytorch``) when it is imported, and
hookscope never imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from hookscope.integrations._common import StepSeen, missing_framework, scalars, user_model, watch_options

try:
    import lightning.pytorch as pl
except ImportError as err:
    raise missing_framework(__name__, "Lightning") from err

if TYPE_CHECKING:
    from hookscope.doctor.findings import Finding
    from hookscope.watching import Watch


class HookscopeCallback(pl.Callback):
    """Watches a LightningModule's training with ``hs.watch``: findings print as they appear and are in
    ``.findings`` after ``fit``.

    ``model``: the module to watch and name findings after (default: the LightningModule's only child that
    holds parameters, e.g. ``self.model = net`` gives ``0``/``conv1``, not ``model.0``; see
    :func:`~hookscope.integrations._common.user_model`). ``options`` are those of ``hs.watch``
    (``doctor``, ``stats``, ``guard``, ``select``, ``every``, ``check_every``, ``thresholds``, ``quiet``,
    ``report``). After each check (every ``check_every`` optimizer steps) the Trainer's loggers get a few
    numbers under ``hookscope/``: findings per kind, the largest activation and gradient magnitudes and the
    count of non-finite values of the latest record.
    """

    def __init__(self, model: nn.Module | None = None, **options: Any) -> None:
        self.model = model
        self.options = watch_options(type(self).__name__, options)
        self.watch: Watch | None = None
        self._steps = StepSeen()
        self._ready = False

    @property
    def findings(self) -> list[Finding]:
        """The findings of the latest fit (empty before one)."""
        return [] if self.watch is None else self.watch.findings

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        from hookscope.watching import watch

        self.watch = watch(user_model(pl_module, self.model), **self.options)
        self._steps.attach(trainer.optimizers)
        self._ready = False

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        if self.watch is None:
            return
        self.watch.gradients_ready()
        self._steps.reset()
        self._ready = True

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.watch is None:
            return
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if isinstance(loss, torch.Tensor):
            # Lightning hands back the loss divided by accumulate_grad_batches; the rules want the batch's
            self.watch.log(loss.detach() * trainer.accumulate_grad_batches)
        if not self._ready:
            return
        self._ready = False
        if not self._steps.stepped:
            self.watch.skip_step()
            return
        self.watch.step_done()
        if self.watch.step % self.watch.options["check_every"] == 0:
            self._log_scalars(trainer)

    def _log_scalars(self, trainer: pl.Trainer) -> None:
        """Right after a check, which read every pending statistic: this costs no extra host sync."""
        if not trainer.loggers:
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
        """Run the last check and remove every hook (idempotent; ``fit`` calls it at its end)."""
        self._steps.remove()
        if self.watch is not None:
            self.watch.close()
