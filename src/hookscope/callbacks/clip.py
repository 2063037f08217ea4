"""Gradient clipping in ``before_step``: by total norm (``GradientClip``) or by value (``GradientClipValue``).

Both run after ``MixedPrecision`` has unscaled the gradients, so the threshold applies to the true
gradients, not to gradients multiplied by the loss scale.
"""

from __future__ import annotations

import torch

from hookscope.train.callback import Callback


class GradientClip(Callback):
    """Rescale all gradients so their total ``norm_type``-norm is at most ``max_norm``.

    ``last_norm`` holds the total norm before clipping as a device tensor (read it when you need it;
    keeping it costs no host sync).
    """

    order = 20
    run_after = ("MixedPrecision",)
    run_valid = False

    def __init__(self, max_norm: float = 1.0, norm_type: float = 2.0) -> None:
        if max_norm <= 0:
            raise ValueError(f"GradientClip: max_norm={max_norm} must be > 0")
        self.max_norm = max_norm
        self.norm_type = norm_type
        self.last_norm: torch.Tensor | None = None

    def before_step(self) -> None:
        self.last_norm = torch.nn.utils.clip_grad_norm_(
            self.learn.model.parameters(), self.max_norm, norm_type=self.norm_type
        )


class GradientClipValue(Callback):
    """Clamp every gradient element into ``[-value, value]``."""

    order = 20
    run_after = ("MixedPrecision",)
    run_valid = False

    def __init__(self, value: float) -> None:
        if value <= 0:
            raise ValueError(f"GradientClipValue: value={value} must be > 0")
        self.value = value

    def before_step(self) -> None:
        torch.nn.utils.clip_grad_value_(self.learn.model.parameters(), self.value)
