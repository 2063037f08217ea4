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

Unless the optimizer can skip a step on the device (a fused one: ``AdamW(..., fused=True)``, the Learner's
default on CUDA). Then the flag is handed to ``opt.step()`` as ``GradScaler`` hands it the scaler's
(``found_inf``): once set, it stays set, and the device leaves that step's update and every later one out.
The host reads it a step late (``late``), just before the next ``opt.step()``, when the device is done with
it: no wait. A buffer snapshot and a journal are kept for that one step in flight, so a late stop puts
back exactly what a stop before the step would. The read is made at once where the state is taken or the
training phase ends (a checkpoint, the epoch's validation), so neither ever sees a step whose verdict is
still on its way.

When a check fails the step is skipped, the buffers (BatchNorm running statistics) and the RNG are put
back as they were before the batch, the :class:`~hookscope.doctor.guard.BatchJournal` (shared with
``hs.watch``) replays the offending batch with :func:`hookscope.find_nonfinite` to name the module, op and
phase — under the autocast the batch ran with (``MixedPrecision``), since a float16 overflow only happens
there — and ``CancelFitException`` ends the fit with the last good weights in place.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from hookscope import compat
from hookscope.doctor.finding_log import stderr_console
from hookscope.doctor.guard import BatchJournal, LateVerdict, NonFiniteCheck, reads_late, stop_message
from hookscope.hooks.nonfinite import NonFiniteReport
from hookscope.hooks.select import Spec
from hookscope.hooks.tensors import model_device
from hookscope.train import distributed
from hookscope.train.callback import Callback
from hookscope.train.events import CancelFitException


class _Group(NamedTuple):
    """The batches of one optimizer step, and what a stop at that step needs: where it was, its journal,
    the buffers of its start, and (read late) its verdict."""

    step: int
    epoch: int
    iter: int
    journal: BatchJournal
    saved: list[torch.Tensor]
    verdict: LateVerdict | None = None


class NonFiniteGuard(Callback):
    """Stops the fit at the first non-finite activation, loss or gradient, keeping the last good weights.

    ``select`` chooses the modules whose outputs are watched (default: every leaf module; ``False`` for
    none — the loss and gradients are still checked). After a stop, ``report`` holds the
    :class:`~hookscope.hooks.nonfinite.NonFiniteReport` of the offending batch, ``stopped_at`` the
    training step and ``reason`` which check failed first. ``quiet=True`` keeps it from printing.

    ``late`` says when each step's verdict is read: None (the default) a step late wherever the optimizer
    can skip a step on the device (a fused one) and the model is not on the CPU, where a read before the
    step would stall the device; True a step late on any device (a fused optimizer required); False always
    before the step.
    """

    order = 20  # after MixedPrecision (10): its scaler skips inf steps itself and unscales the gradients
    run_after = ("MixedPrecision", "GradientClip")
    run_valid = False

    def __init__(self, select: Spec | bool = None, quiet: bool = False, late: bool | None = None) -> None:
        self.select = select
        self.quiet = quiet
        self.late = late
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
        self._late = False  # this fit reads late where its optimizer can skip a step on the device
        self._in_flight: _Group | None = None  # the step whose verdict is on its way (read late)
        self._spare: list[torch.Tensor] = []  # the buffer snapshot the next step in flight takes over
        self._where = (0, 0)  # the stopped step's epoch and batch

    def before_fit(self) -> None:
        self.report = self.stopped_at = self.reason = None
        self.journal, self._checked, self._in_flight = BatchJournal(self.learn.device), True, None
        model = self.learn.model
        self.check.attach(model)
        self._params = list(model.parameters())
        # the float buffers (running statistics) and the 0-d counters (num_batches_tracked counts the bad
        # batch), not masks and tables, which training does not change
        self._buffers = [b for b in model.buffers() if b.is_floating_point() or b.dim() == 0]
        self._saved = [torch.empty_like(b) for b in self._buffers]
        self._late = self._reads_late()
        self._spare = [torch.empty_like(b) for b in self._buffers] if self._late else []
        self._apply_resumed()

    def _reads_late(self) -> bool:
        opt = self.learn.opt
        refusal = (
            f"NonFiniteGuard(late=True): learn.opt ({type(opt).__name__}) cannot skip a step on the "
            "device; make it a fused optimizer (e.g. opt_func=partial(torch.optim.AdamW, fused=True)) "
            "or leave late=None"
        )
        return reads_late(opt, self.late, self.learn.device, refusal)

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
        self.read_late(stop=True)
        learn = self.learn
        # asked again each step: a callback may have swapped learn.opt for one that cannot skip a step
        late = self._late and compat.skips_steps_on_device(learn.opt)
        verdict = self.check.flag(self._params, learn.loss.device) if late else None
        if verdict is None:
            reason = self.check.decide(self._params, learn.loss.device)
            if reason is not None:
                self._stop(reason, self._group())
            self.journal.clear()
        else:
            compat.skip_step_if(learn.opt, verdict.flag.found)
            self._in_flight = self._group(verdict)
            self.journal = BatchJournal(learn.device)
            self._saved, self._spare = self._spare, self._saved  # the step in flight keeps its snapshot
        self._checked = True

    def after_step(self) -> None:
        if self._late:
            compat.skip_step_if(self.learn.opt, None)

    def after_train(self) -> None:
        self.read_late(stop=True)  # validation, the epoch's end and its checkpoint see a judged step

    def after_fit(self) -> None:
        self.read_late(stop=False)  # another callback cancelled the fit with a step in flight
        self.check.detach()

    def read_late(self, stop: bool) -> None:
        """Read the verdict of the step in flight, if any. A failed one is a stop at that step: with
        ``stop`` the fit is cancelled here, else (the fit is ending anyway) only the stop's rollback and
        report are made."""
        group, self._in_flight = self._in_flight, None
        if group is None or not group.verdict.failed():
            return
        self._stop(group.verdict.reason(), group, cancel=stop)

    def _group(self, verdict: LateVerdict | None = None) -> _Group:
        learn = self.learn
        return _Group(learn.training_step, learn.epoch, learn.iter, self.journal, self._saved, verdict)

    # ---- checkpoint state ------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Nothing after a checked step (every checkpoint but a Ctrl-C inside gradient accumulation); else
        the group's flags so far, folded on the device, and the buffers of its start, so the step that
        ends the group after a resume still checks and rolls back the whole group. A step in flight is
        judged first: when it failed, the fit stops here and the checkpoint is not written."""
        self.read_late(stop=True)
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
        saved = self._saved
        if len(state["buffers"]) != len(saved):  # saved before the counters were kept: floats only
            saved = [b for b in saved if b.is_floating_point()]
        if saved:
            compat.foreach_copy_(saved, [b.to(device) for b in state["buffers"]])

    def on_failure(self, exc: BaseException) -> None:
        self.read_late(stop=False)  # before a Checkpoint's save of the failure (it runs later)
        if self.learn.opt is not None:
            compat.skip_step_if(self.learn.opt, None)
        self.check.detach()

    def _stop(self, reason: str, group: _Group, cancel: bool = True) -> None:
        learn = self.learn
        learn.opt.zero_grad(set_to_none=True)
        compat.skip_step_if(learn.opt, None)
        if self._buffers:
            compat.foreach_copy_(self._buffers, group.saved)
        self.check.detach()
        # under torchrun every rank stops here together; the rank whose batch holds the fault names it
        reports = distributed.all_gather(group.journal.blame(learn.model, learn.loss_func))
        self.report = next((r for r in reports if r.found), reports[0])
        self.stopped_at, self.reason, self._where = group.step, reason, (group.epoch, group.iter)
        if not self.quiet:
            stderr_console().print(self.message(), markup=False)
        if cancel:
            raise CancelFitException()

    def message(self) -> str:
        """One paragraph: where training stopped, what was kept, and the blame."""
        if self.stopped_at is None or self.report is None or self.reason is None:
            return "NonFiniteGuard: every checked loss, activation and gradient was finite."
        epoch, batch = self._where
        stopped = f"NonFiniteGuard stopped training at step {self.stopped_at} (epoch {epoch}, batch {batch})"
        return stop_message(stopped, self.stopped_at, self.reason, self.report, with_loss=True)
