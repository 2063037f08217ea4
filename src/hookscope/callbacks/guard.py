"""NonFiniteGuard: stop training at the first NaN/Inf loss, activation or gradient, before it lands.

The decision is :class:`hookscope.doctor.guard.NonFiniteCheck`'s (shared with ``hs.watch``); this
callback feeds it the Learner's events and does what a Learner can do with a "no": roll back and cancel.

Trade-off (read this before changing it): the guard must never let a non-finite update reach the weights,
and it must not stall the device once per layer. So the checks are cheap device-side reductions (one
min/max per watched module output, the loss) that stay on the device, handed with every gradient to one
fused check that sets a flag there, and ONE number is read on the host per training step, just before
``opt.step()``. That read is the price of stopping a bad update without keeping a second copy of the
weights and of the optimizer state (reading less often would mean rolling both back, and losing the good
steps in between).
On CPU the read is free; on a GPU it costs the run-ahead of one step, and only while the guard is attached.

When a check fails the step is skipped, the buffers (BatchNorm running statistics) and the RNG are put
back as they were before the batch, the :class:`~hookscope.doctor.guard.BatchJournal` (shared with
``hs.watch``) replays the offending batch with :func:`hookscope.find_nonfinite` to name the module, op and
phase — under the autocast the batch ran with (``MixedPrecision``), since a float16 overflow only happens
there — and ``CancelFitException`` ends the fit with the last good weights in place.
"""

from __future__ import annotations

from typing import Any

import torch

from hookscope import compat
from hookscope.doctor.finding_log import stderr_console
from hookscope.doctor.guard import BatchJournal, NonFiniteCheck, stop_message
from hookscope.hooks.nonfinite import NonFiniteReport
from hookscope.hooks.select import Spec
from hookscope.hooks.tensors import model_device
from hookscope.train import distributed
from hookscope.train.callback import Callback
from hookscope.train.events import CancelFitException


class NonFiniteGuard(Callback):
    """Stops the fit at the first non-finite activation, loss or gradient, keeping the last good weights.

    ``select`` chooses the modules whose outputs are watched (default: every leaf module; ``False`` for
    none — the loss and gradients are still checked). After a stop, ``report`` holds the
    :class:`~hookscope.hooks.nonfinite.NonFiniteReport` of the offending batch, ``stopped_at`` the
    training step and ``reason`` which check failed first. ``quiet=True`` keeps it from printing.
    """

    order = 20  # after MixedPrecision (10): its scaler skips inf steps itself and unscales the gradients
    run_after = ("MixedPrecision", "GradientClip")
    run_valid = False

    def __init__(self, select: Spec | bool = None, quiet: bool = False) -> None:
        self.select = select
        self.quiet = quiet
        self.report: NonFiniteReport | None = None
        self.stopped_at: int | None = None
        self.reason: str | None = None
        self.check = NonFiniteCheck(select, training=lambda module: self.learn.training)
        self.journal = BatchJournal(torch.device("cpu"))  # the batches since the last check
        self._checked = True  # no batch since the last check: the next one snapshots the buffers
        self._buffers: list[torch.Tensor] = []
        self._saved: list[torch.Tensor] = []
        self._params: list[torch.nn.Parameter] = []  # the model's, taken once per fit (not once per step)
        self._resumed: dict[str, Any] = {}  # a checkpoint's unchecked group, applied in before_fit

    def before_fit(self) -> None:
        self.report = self.stopped_at = self.reason = None
        self.journal, self._checked = BatchJournal(self.learn.device), True
        model = self.learn.model
        self.check.attach(model)
        self._params = list(model.parameters())
        self._buffers = [b for b in model.buffers() if b.is_floating_point()]
        self._saved = [torch.empty_like(b) for b in self._buffers]
        self._apply_resumed()

    def before_batch(self) -> None:
        # Flags pile up until a step checks them: with gradient accumulation, batches that end before
        # opt.step() are checked with the step of their group, and the buffers roll back to its start.
        if self._checked and self._buffers:
            compat.foreach_copy_(self._saved, self._buffers)
        self._checked = False
        # MixedPrecision (which runs first) has entered autocast for this batch when it is on
        if self.learn.yb:  # only batches that reach a loss lead to a step (and a check)
            self.journal.record(self.learn.xb, targets=self.learn.yb)

    def after_loss(self) -> None:
        self.check.loss(self.learn.loss)

    def before_step(self) -> None:
        reason = self.check.decide(self._params, self.learn.loss.device)
        if reason is not None:
            self._stop(reason)
        self.journal.clear()
        self._checked = True

    def after_fit(self) -> None:
        self.check.detach()

    # ---- checkpoint state ------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Nothing after a checked step (every checkpoint but a Ctrl-C inside gradient accumulation); else
        the group's flags so far, folded on the device, and the buffers of its start, so the step that
        ends the group after a resume still checks and rolls back the whole group."""
        if self._checked:
            return {}
        return {**self.check.state_dict(), "buffers": list(self._saved)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Keep the unchecked group's state for the next ``before_fit`` (which builds the buffers)."""
        self._resumed = dict(state)

    def _apply_resumed(self) -> None:
        state, self._resumed = self._resumed, {}
        if not state:
            return
        device = model_device(self.learn.model)
        self.check.load_state_dict(state, device)
        self._checked = False
        if self._saved:
            compat.foreach_copy_(self._saved, [b.to(device) for b in state["buffers"]])

    def on_failure(self, exc: BaseException) -> None:
        self.check.detach()

    def _stop(self, reason: str) -> None:
        learn = self.learn
        learn.opt.zero_grad(set_to_none=True)
        if self._buffers:
            compat.foreach_copy_(self._buffers, self._saved)
        self.check.detach()
        # under torchrun every rank stops here together; the rank whose batch holds the fault names it
        reports = distributed.all_gather(self.journal.blame(learn.model, learn.loss_func))
        self.report = next((r for r in reports if r.found), reports[0])
        self.stopped_at, self.reason = learn.training_step, reason
        if not self.quiet:
            stderr_console().print(self.message(), markup=False)
        raise CancelFitException()

    def message(self) -> str:
        """One paragraph: where training stopped, what was kept, and the blame."""
        if self.stopped_at is None or self.report is None or self.reason is None:
            return "NonFiniteGuard: every checked loss, activation and gradient was finite."
        learn = self.learn
        stopped = (
            f"NonFiniteGuard stopped training at step {self.stopped_at} (epoch {learn.epoch}, "
            f"batch {learn.iter})"
        )
        return stop_message(stopped, self.stopped_at, self.reason, self.report, with_loss=True)
