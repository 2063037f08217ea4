"""``HookscopeCallback`` for fastai: the doctor and statistics of ``hs.watch`` in a fastai ``Learner``.

fastai fires ``before_step`` once per optimizer step, after its ``MixedPrecision`` unscaled the
gradients (a step the ``GradScaler`` skips raises ``CancelStepException`` there, which becomes
``after_cancel_step``), after ``GradientAccumulation`` let the step through and before ``GradientClip``:
that is where the gradients are read. ``after_step`` closes the step. The loss and the target
(``learn.yb``) are read at ``after_loss``; the run's length and batches per epoch at ``before_fit``, and
fastai's ``ParamScheduler`` (``fit_one_cycle``, ``fit_flat_cos``) is named in ``lr_schedule``.

This module is the integration: it imports fastai when it is imported, and hookscope never imports it.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from hookscope.integrations._common import WatchCallback, missing_framework

try:
    from fastai.callback.core import Callback
    from fastai.callback.fp16 import MixedPrecision
    from fastai.callback.schedule import ParamScheduler
except ImportError as err:
    raise missing_framework(__name__, "fastai") from err


class HookscopeCallback(WatchCallback, Callback):
    """Watches a fastai Learner's training with ``hs.watch``; the Learner holds it as ``learn.hookscope``,
    and ``learn.hookscope.findings`` holds what the doctor found.

    ``watched``: the module to watch and name findings after (default: ``learn.model``, or its only child
    holding parameters when it holds all of them). ``options`` are those of ``hs.watch``. fastai fires no
    event when a fit raises: the hooks of such a fit are removed by the next fit or by :meth:`close`.
    """

    order = MixedPrecision.order + 0.5  # after the unscaling, before GradientClip (order + 1)
    run_valid = False

    def __init__(self, watched: nn.Module | None = None, **options: Any) -> None:
        super().__init__(**options)
        # not ``model``: a fastai callback must not shadow an attribute of its Learner
        self.watched = watched

    def before_fit(self) -> None:
        learn = self.learn
        self._start(learn.model, self.watched, [learn.opt], learn.dls.train)
        batches = len(learn.dls.train)
        schedulers = [type(cb).__name__ for cb in learn.cbs if isinstance(cb, ParamScheduler)]
        self._plan(learn.n_epoch * batches, batches, schedulers)

    def after_loss(self) -> None:
        learn = self.learn
        if learn.training:
            self._log(learn.loss, target=learn.yb[0] if len(learn.yb) == 1 else None)

    def before_step(self) -> None:
        self._gradients_ready()

    def after_step(self) -> None:
        if self.watch is not None:
            self.watch.step_done()

    def after_cancel_step(self) -> None:
        if self.watch is not None:
            self.watch.skip_step()

    def after_fit(self) -> None:
        self.close()
