"""Mixed precision with ``torch.amp``: autocast around forward and loss, a GradScaler for float16.

bfloat16 has float32's exponent range, so it trains without loss scaling (the default on CPU).
float16 (the default on CUDA) underflows small gradients, so the loss is multiplied by a scale before
backward and the gradients divided by it before the step; steps whose gradients overflowed are skipped
and the scale is lowered. The Learner owns ``opt.step()``, so this callback unscales in ``before_step``
(clipping, ordered after it, sees true gradients), skips the step with ``CancelStepException`` when the
unscaled gradients are not finite, and updates the scale after every training batch that reached
``before_step``.
"""

from __future__ import annotations

from typing import Any

import torch

from hookscope.hooks.tensors import model_device
from hookscope.train.callback import Callback
from hookscope.train.events import CancelStepException

_LOW_PRECISION = (torch.float16, torch.bfloat16)


class MixedPrecision(Callback):
    """Run forward and loss under ``torch.autocast(dtype)``; use a ``torch.amp.GradScaler`` for float16.

    ``dtype=None`` picks float16 on CUDA and bfloat16 elsewhere. ``init_scale`` and ``growth_interval``
    go to the GradScaler. ``skipped_steps`` counts the steps skipped because gradients overflowed.
    """

    order = 10

    def __init__(
        self, dtype: torch.dtype | None = None, init_scale: float = 2.0**16, growth_interval: int = 2000
    ) -> None:
        if dtype is not None and dtype not in _LOW_PRECISION:
            raise ValueError(f"MixedPrecision: dtype={dtype}; use torch.float16, torch.bfloat16 or None")
        self.requested_dtype = dtype
        self.init_scale = init_scale
        self.growth_interval = growth_interval
        self.dtype: torch.dtype | None = None
        self.device_type = "cpu"
        self.scaler: torch.amp.GradScaler | None = None
        self.skipped_steps = 0
        self._autocast: torch.autocast | None = None
        self._update_pending = False
        self._pending_state: dict[str, Any] | None = None

    def fsdp_policy(self, device_type: str) -> Any:
        """FSDP2's ``MixedPrecisionPolicy`` for this precision, which ``Learner(shard=...)`` applies:
        parameters gathered and computed in the low dtype (half the traffic), gradients reduced in
        float32. Autocast stays on around forward and loss, for the ops it keeps in float32."""
        from torch.distributed.fsdp import MixedPrecisionPolicy

        default = torch.float16 if device_type == "cuda" else torch.bfloat16
        return MixedPrecisionPolicy(param_dtype=self.requested_dtype or default, reduce_dtype=torch.float32)

    def before_fit(self) -> None:
        self.device_type = model_device(self.learn.model).type
        default = torch.float16 if self.device_type == "cuda" else torch.bfloat16
        self.dtype = self.requested_dtype or default
        if not torch.amp.is_autocast_available(self.device_type):
            raise RuntimeError(
                f"MixedPrecision: torch.autocast does not support device {self.device_type!r}; "
                "remove the callback or move the model to cpu/cuda"
            )
        if self.dtype == torch.float16 and self.scaler is None:
            self.scaler = torch.amp.GradScaler(
                self.device_type, init_scale=self.init_scale, growth_interval=self.growth_interval
            )
        if self.scaler is not None and self._pending_state is not None:
            self.scaler.load_state_dict(self._pending_state)
            self._pending_state = None

    def before_batch(self) -> None:
        self._autocast = torch.autocast(self.device_type, dtype=self.dtype)
        self._autocast.__enter__()

    def after_pred(self) -> None:
        # Metrics and predictions are read in float32: low-precision logits lose ranks and sums.
        pred = self.learn.pred
        if isinstance(pred, torch.Tensor) and pred.dtype in _LOW_PRECISION:
            self.learn.pred = pred.float()

    def after_loss(self) -> None:
        self._leave_autocast()

    def before_backward(self) -> None:
        if self.scaler is not None:
            self.learn.loss_grad = self.scaler.scale(self.learn.loss_grad)

    def before_step(self) -> None:
        if self.scaler is None:
            return
        opt = self.learn.opt
        self._update_pending = True
        self.scaler.unscale_(opt)
        grads = [p.grad for group in opt.param_groups for p in group["params"] if p.grad is not None]
        # One host sync, as GradScaler.step makes: a step on inf/NaN gradients would ruin the weights.
        if grads and not torch.isfinite(torch.nn.utils.get_total_norm(grads)):
            self.skipped_steps += 1
            raise CancelStepException()

    def after_batch(self) -> None:
        self._settle()

    def after_fit(self) -> None:
        self._settle()

    def on_failure(self, exc: BaseException) -> None:
        self._settle()

    def state_dict(self) -> dict[str, Any]:
        scaler_state = self.scaler.state_dict() if self.scaler is not None else self._pending_state
        return {"scaler": scaler_state, "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.skipped_steps = state.get("skipped_steps", 0)
        scaler_state = state.get("scaler")
        if scaler_state is None:
            # Saved before any float16 fit: the next fit builds a fresh scaler.
            self.scaler, self._pending_state = None, None
            return
        if self.scaler is None:
            self._pending_state = scaler_state
            return
        self.scaler.load_state_dict(scaler_state)

    def _settle(self) -> None:
        """End the batch's mixed-precision state however the batch ended (normally, cancelled, stopped
        or failed): autocast off, and the scale updated once the gradients were unscaled — GradScaler
        refuses a second unscale before an update, so a stale one would break the next step."""
        self._leave_autocast()
        if self._update_pending:
            self._update_pending = False
            self.scaler.update()

    def _leave_autocast(self) -> None:
        if self._autocast is None:
            return
        self._autocast.__exit__(None, None, None)
        self._autocast = None
