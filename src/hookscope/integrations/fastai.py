"""``HookscopeCallback`` for fastai: the doctor and statistics of ``hs.watch`` in a fastai ``Learner``.

fastai fires ``before_step`` once per optimizer step, after its ``MixedPrecision`` unscaled the
gradients (a step the ``GradScaler`` skips raises ``CancelStepException`` there, which becomes
``after_cancel_step``), after ``GradientAccumulation`` let the step through and before ``GradientClip``:
that is where the gradients are read. ``after_step`` closes the step.

This module is the integration: it imports fastai when it is imported, and hookscope never imports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import nn

from hookscope.integrations._common import missing_framework, user_model, watch_options

try:
    from fastai.callback.core import Callback
    from fastai.callback.fp16 import MixedPrecision
except ImportError as err:
    raise missing_framework(__name__, "fastai") from err

if TYPE_CHECKING:
    from hookscope.doctor.findings import Finding
    from hookscope.watching import Watch


class HookscopeCallback(Callback):
    """Watches a fastai Learner's training with ``hs.watch``; the Learner holds it as ``learn.hookscope``,
    and ``learn.hookscope.findings`` holds what the doctor found.

    ``watched``: the module to watch and name findings after (default: ``learn.model``, or its only child
    holding parameters when it holds all of them). ``options`` are those of ``hs.watch``. fastai fires no
    event when a fit raises: the hooks of such a fit are removed by the next fit or by :meth:`close`.
    """

    order = MixedPrecision.order + 0.5  # after the unscaling, before GradientClip (order + 1)
    run_valid = False

    def __init__(self, watched: nn.Module | None = None, **options: Any) -> None:
        # not ``model``: a fastai callback must not shadow an attribute of its Learner
        self.watched = watched
        self.options = watch_options(type(self).__name__, options)
        self.watch: Watch | None = None

    @property
    def findings(self) -> list[Finding]:
        """The findings of the latest fit (empty before one)."""
        return [] if self.watch is None else self.watch.findings

    def before_fit(self) -> None:
        from hookscope.watching import watch

        self.close()
        self.watch = watch(user_model(self.learn.model, self.watched), **self.options)

    def after_loss(self) -> None:
        if self.watch is not None and self.learn.training:
            self.watch.log(self.learn.loss.detach())

    def before_step(self) -> None:
        if self.watch is not None:
            self.watch.gradients_ready()

    def after_step(self) -> None:
        if self.watch is not None:
            self.watch.step_done()

    def after_cancel_step(self) -> None:
        if self.watch is not None:
            self.watch.skip_step()

    def after_fit(self) -> None:
        self.close()

    def close(self) -> None:
        """Run the last check and remove every hook (idempotent; the end of ``fit`` calls it)."""
        if self.watch is not None:
            self.watch.close()
