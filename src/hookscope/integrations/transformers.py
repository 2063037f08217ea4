"""``HookscopeCallback`` for Hugging Face's ``Trainer``: the doctor and statistics of ``hs.watch`` there.

The Trainer fires ``on_pre_optimizer_step`` once per optimizer step, after the last micro-batch of a
gradient accumulation and after Accelerate unscaled the gradients, so they are read there. The Trainer
clips (``max_grad_norm``, 1.0 by default) before that event: the norms the doctor sees are the clipped
ones; the growth from layer to layer, which the exploding and vanishing rules read, is unchanged by
clipping. A step post-hook on the optimizer tells a real step from one the ``GradScaler`` skipped. The
loss rules read ``outputs.loss`` of the model's forward, when the model computes its loss, and the label
mix its ``labels`` argument; the run's length (``max_steps``) and the scheduler come from the Trainer.

This module is the integration: it imports transformers when it is imported, and hookscope never imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from hookscope.hooks.handles import HookSet
from hookscope.integrations._common import WatchCallback, missing_framework

try:
    from transformers import TrainerCallback
except ImportError as err:
    raise missing_framework(__name__, "transformers") from err

if TYPE_CHECKING:
    from transformers import TrainerControl, TrainerState, TrainingArguments


class HookscopeCallback(WatchCallback, TrainerCallback):
    """Watches a ``transformers.Trainer``'s training with ``hs.watch``; ``.findings`` after ``train()``.

    ``model``: the module to watch and name findings after (default: the Trainer's model, or its only child
    holding parameters when it holds all of them — an adapter that adds a loss to a plain module reports
    that module's names). ``options`` are those of ``hs.watch``. The Trainer fires no event when training
    raises: the hooks of such a run are removed by the next ``train()`` or by :meth:`close`.
    """

    def __init__(self, model: nn.Module | None = None, **options: Any) -> None:
        super().__init__(**options)
        self.model = model
        self._loss_hook = HookSet()

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        model = kwargs["model"]
        self._start(model, self.model, [kwargs["optimizer"]], kwargs.get("train_dataloader"))
        self._loss_hook.forward(model, self._log_loss, with_kwargs=True)
        scheduler = kwargs.get("lr_scheduler")
        self._plan(state.max_steps or None, None, [scheduler] if scheduler is not None else [])

    def _log_loss(self, module: nn.Module, args: Any, kwargs: dict[str, Any], output: Any) -> None:
        loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
        if module.training and isinstance(loss, torch.Tensor):
            self._log(loss, target=kwargs.get("labels"))

    def on_pre_optimizer_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._gradients_ready()

    def on_optimizer_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._step_ended()

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.close()

    def close(self) -> None:
        """Run the last check and remove every hook (idempotent; the end of ``train()`` calls it)."""
        self._loss_hook.remove()
        super().close()
