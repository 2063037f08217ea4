"""The :class:`ProtocolRecorder`: the checks of the loop's protocol behind the engine's feed interface.

It is fed like the engine's other recorders — :meth:`~ProtocolRecorder.attach`,
:meth:`~ProtocolRecorder.watch_optimizer`, :meth:`~ProtocolRecorder.begin_batch`,
:meth:`~ProtocolRecorder.log_loss`, :meth:`~ProtocolRecorder.log_target`,
:meth:`~ProtocolRecorder.gradients_ready`, :meth:`~ProtocolRecorder.step_done`,
:meth:`~ProtocolRecorder.step_cancelled` or :meth:`~ProtocolRecorder.discard_batch`,
:meth:`~ProtocolRecorder.end_batch`, :meth:`~ProtocolRecorder.begin_valid` /
:meth:`~ProtocolRecorder.end_valid`,
:meth:`~ProtocolRecorder.close` or :meth:`~ProtocolRecorder.fail` — and registers its own hooks: a
forward pre-hook on the model (modes, the input fingerprint), a forward hook (graphs) and host hooks on
a few parameters (stale gradients). :meth:`~ProtocolRecorder.findings` reads what is pending on the
device in one transfer (:meth:`~ProtocolRecorder.flush`), runs the checks on host numbers and returns
the findings not returned before.

Per step it costs a little host work (the step, the learning rates, the root's mode); on the steps
:class:`~.looks.Looks` watches (every step of the first 32, then 4 in every 32, after a validation pass
and after the model's mode changed), also the parameters' hooks and the modules' flags, two small device
ops (the input's fingerprint, a copy of the batch's labels) and a tag in the output's graph. Never a host
read.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hookscope.doctor.findings import Finding
from hookscope.doctor.protocol.batches import LabelMix, RepeatedBatch
from hookscope.doctor.protocol.gradients import StaleGradients
from hookscope.doctor.protocol.graphs import GraphsKeptAlive
from hookscope.doctor.protocol.looks import Looks
from hookscope.doctor.protocol.lr import LearningRateSchedule
from hookscope.doctor.protocol.modes import ModeCheck
from hookscope.hooks.handles import HookSet
from hookscope.hooks.stats import to_host
from hookscope.hooks.tensors import first_tensor


class ProtocolRecorder:
    """``stale_gradients``, ``train_in_eval_mode`` / ``eval_in_train_mode``, ``repeated_batch``,
    ``unshuffled_data``, ``graph_kept_alive`` and ``lr_schedule`` (one module each in this package).

    ``total_steps``: the run's length in optimizer steps when the loop knows it (the learning-rate
    collapse is judged against it); ``batches_per_epoch``: 1 switches ``repeated_batch`` off (one batch
    per epoch repeats by design); ``schedulers``: the learning-rate schedulers (objects with an
    ``optimizer``, or names), to name them.
    """

    # Its histories are bounded without thinning: the engine's cadence has nothing to follow here.
    thinnings = 0

    def __init__(
        self, total_steps: int | None = None, batches_per_epoch: int | None = None, schedulers: Any = ()
    ) -> None:
        self.stale = StaleGradients()
        self.modes = ModeCheck()
        self.repeats = RepeatedBatch()
        self.labels = LabelMix()
        self.graphs = GraphsKeptAlive()
        self.lr = LearningRateSchedule()
        self.looks = Looks()  # the steps the costly checks (device ops, parameter hooks, modes) look at
        self.plan_run(total_steps, batches_per_epoch, schedulers)
        self._hooks = HookSet()
        self._root_training = True  # the model's mode at its last forward
        self._reported: set[str] = set()
        self._rings: list[RepeatedBatch | LabelMix] = []  # the checks whose rows pending() handed out

    def plan_run(
        self, total_steps: int | None = None, batches_per_epoch: int | None = None, schedulers: Any = ()
    ) -> None:
        """What the loop knows of the run ahead (see the class); a loop that learns it late (at the start
        of a fit) says it here."""
        self.repeats.enabled = batches_per_epoch != 1
        self.lr.total_steps = total_steps
        self.lr.schedulers = list(schedulers)

    # ---- feed ----------------------------------------------------------------------------------------

    def attach(self, model: nn.Module) -> None:
        self._hooks.remove()
        self.looks.restart()
        self._root_training = model.training
        self.stale.attach(model)
        self.modes.attach(model)
        self._hooks.forward_pre(model, self._before_forward, with_kwargs=True)
        self._hooks.forward(model, self._after_forward)

    def watch_optimizer(self, optimizer: torch.optim.Optimizer | None) -> None:
        self.stale.watch_optimizer(optimizer)
        self.lr.watch_optimizer(optimizer)

    def begin_batch(self, step: int, training: bool, recorded: bool = True) -> None:
        """A batch starts. ``recorded`` (the engine's cadence) does not matter here: the protocol keeps its
        own looks (:mod:`~.looks`); it is taken so the engine can drive every recorder alike."""
        self.looks.begin_batch(step, training)
        if training:
            self.stale.watch(self.looks.watching)
        for check in (self.stale, self.modes, self.repeats, self.labels, self.graphs, self.lr):
            check.begin_batch(step, training)

    def log_loss(self, loss: torch.Tensor, training: bool) -> None:
        """Nothing reads the loss: ``graph_kept_alive`` tags the model's output, an ancestor of it."""

    def log_target(self, target: Any, training: bool = True) -> None:
        """The batch's targets: class indices feed ``unshuffled_data`` (watched training batches)."""
        if training and self.looks.watching:
            self.labels.log_target(target)

    def gradients_ready(self) -> None:
        self.stale.gradients_ready()

    def step_done(self) -> None:
        self.stale.step_done()
        self.modes.step_done()
        self.repeats.step_done()
        self.graphs.step_done()
        self.lr.step_done()

    def step_cancelled(self) -> None:
        """The step was cancelled after :meth:`gradients_ready`: no step, so its input is not counted."""
        self.repeats.discard_batch()

    def discard_batch(self) -> None:
        self.repeats.discard_batch()

    def end_batch(self) -> None:
        """Nothing closes with the step: each check keeps its own per-step state."""

    def begin_valid(self) -> None:
        self.modes.begin_valid()

    def end_valid(self, step: int) -> None:
        self.modes.end_valid(step)

    def close(self) -> None:
        """Remove the hooks; the next :meth:`findings` is the run's last (it judges the growth of the
        learning rate)."""
        self._hooks.remove()
        self.stale.close()
        self.lr.close()

    def fail(self) -> None:
        self._hooks.remove()
        self.stale.close()

    # ---- checking ------------------------------------------------------------------------------------

    def flush(self) -> None:
        """The fingerprints and class histograms written since the last read, in one transfer."""
        pending = self.pending()
        if pending:
            self.store(to_host(pending))

    def pending(self) -> list[torch.Tensor]:
        """The device rows written since the last read (fingerprints, labels): a caller that reads other
        tensors too copies them in its own transfer and hands the host copies to :meth:`store`."""
        rows = [(check, check.ring.pending()) for check in (self.repeats, self.labels)]
        rows = [(check, buffer) for check, buffer in rows if buffer is not None]
        self._rings = [check for check, _ in rows]
        return [buffer for _, buffer in rows]

    def store(self, host: list[Any]) -> None:
        """The host copies of :meth:`pending`'s tensors, in its order."""
        for check, values in zip(self._rings, host, strict=True):
            check.read(values)
        self._rings = []

    def findings(self) -> list[Finding]:
        """Read what is pending, run the checks and return the findings not returned before (each carries
        the step it holds since)."""
        self.flush()
        self.labels.check()
        self.graphs.check()
        found = [
            *self.stale.findings(),
            *self.modes.findings(),
            *self.repeats.findings(),
            *self.labels.findings(),
            *self.graphs.findings(),
            *self.lr.findings(),
        ]
        new = [f for f in found if f"{f.kind}/{f.module}" not in self._reported]
        self._reported.update(f"{f.kind}/{f.module}" for f in new)
        return new

    # ---- checkpoint state ----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Each check's host state (pending device values read first) and what was reported."""
        self.flush()
        return {
            "reported": sorted(self._reported),
            "stale": self.stale.state_dict(),
            "modes": self.modes.state_dict(),
            "repeats": self.repeats.state_dict(),
            "labels": self.labels.state_dict(),
            "graphs": self.graphs.state_dict(),
            "lr": self.lr.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._reported = set(state["reported"])
        self.stale.load_state_dict(state["stale"])
        self.modes.load_state_dict(state["modes"])
        self.repeats.load_state_dict(state["repeats"])
        self.labels.load_state_dict(state["labels"])
        self.graphs.load_state_dict(state["graphs"])
        self.lr.load_state_dict(state["lr"])
        self.looks.restart()

    # ---- hooks ---------------------------------------------------------------------------------------

    def _before_forward(self, model: nn.Module, args: tuple, kwargs: dict) -> None:
        if model.training != self._root_training:  # ``model.eval()`` or ``model.train()``: a change of course
            self._root_training = model.training
            self.looks.restart()
        grad = torch.is_grad_enabled()
        if self.looks.watching or not grad:  # an evaluation's forward is always read
            self.modes.forward(model)
        if self.looks.watching and grad:
            self.repeats.forward(first_tensor(args) if args else first_tensor(kwargs))

    def _after_forward(self, model: nn.Module, args: tuple, output: Any) -> None:
        # an evaluation's forward with autograd (no torch.no_grad()) is tagged whatever the look
        if (self.looks.watching or not model.training) and torch.is_grad_enabled():
            self.graphs.forward_output(first_tensor(output))
