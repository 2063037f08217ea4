"""The Doctor: watches a training run and says, in plain words, what is wrong and where.

One callback mapping the Learner's events to the calls of the doctor's engine
(:class:`hookscope.doctor.engine.Engine`, which holds the recorders, the cadence, the rules, the findings
and their printing), exactly as ``hs.watch`` and the integrations do from their loops: ``before_batch`` ->
``begin_batch``, ``after_loss`` -> ``log_loss``, ``before_step`` -> ``gradients_ready`` (after
MixedPrecision unscales, before GradientClip clips: its ``order`` and ``run_after``/``run_before`` say so),
``after_step`` -> ``step_done``, ``after_cancel_step`` -> ``step_cancelled`` (or ``discard_batch`` when the
step was cancelled before the gradients were final: a grad scaler skipped it), ``after_batch`` ->
``end_batch``, the validation phases, ``after_fit`` -> ``close``, ``on_failure`` -> ``fail``; and what
the loop knows that a hand-written one may not: the run's length, its batches per epoch and the
scheduler callbacks (``plan_run``, at ``before_train``), each training batch's targets (``log_target``,
at ``before_batch``), and whether the training loader shuffles (at the first ``before_fit``). Every
``check_every`` training steps (and once at the end) the engine reads everything pending in a few bulk
transfers and applies the rules of :mod:`hookscope.doctor.rules`. New findings are printed once,
deduplicated by (kind, module), and kept in ``learn.doctor.findings``.

Where the time goes (``input_bound``, ``step_stalls``, ``memory_growth``, ``page_faults``): the engine
times every training step; the Doctor hands it the training loader (its settings are named in the
advice) and, through :meth:`Doctor.wrap_method` (the dispatch table's general mechanism), times every
other callback's events, so a stall names the callback that ran in it. ``Checkpoint`` says when it saves
(:meth:`Doctor.note`).

``Doctor(guard=True)`` adds a :class:`NonFiniteGuard` beside it as a companion (see
:attr:`hookscope.train.callback.Callback.companions`): a callback of its own, placed by its own order.

``hs.diagnose(model_or_learner, data, steps=...)`` runs a short training on a copy of the model with a
Doctor attached, as a quick check before a long run.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from hookscope import compat
from hookscope.callbacks.guard import NonFiniteGuard
from hookscope.callbacks.layer_stats import LayerStatistics
from hookscope.callbacks.schedule import LRScheduler, ParamScheduler
from hookscope.doctor import rules
from hookscope.doctor.engine import CHECK_EVERY, Engine
from hookscope.doctor.findings import Finding, Thresholds
from hookscope.doctor.preflight import preflight, training_loader
from hookscope.doctor.preflight.overlap import train_valid_overlap
from hookscope.doctor.protocol import loader_not_shuffled
from hookscope.doctor.recorders import ActivationRecorder, GradientRecorder
from hookscope.doctor.timing import TimingRecorder
from hookscope.hooks.select import Spec
from hookscope.train import distributed
from hookscope.train.callback import Callback
from hookscope.train.data import DataLoaders, require_batches
from hookscope.train.events import CancelFitException
from hookscope.train.learner import Learner, method_owner


class Doctor(Callback):
    """Diagnoses a run: dead units, saturation, exploding/vanishing gradients, missing gradients,
    frozen or never-updated parameters, update ratios, loss divergence, oscillation and plateaus,
    overfitting and NaN/Inf (with the blamed module and op); and the mistakes of the loop around the
    model: stale gradients, training in eval mode (or evaluating in train mode), the same batch every
    step, unshuffled data, graphs kept alive and a collapsing learning-rate schedule; and where the time
    goes: steps waiting for data, stalls (naming the callback, checkpoint save or collector that ran in
    them), memory that grows and, on the CPU, steps that fault in the memory the allocator gave back
    (``timing`` holds the breakdown, see docs/performance.md).

    ``select`` picks the layers watched (None: every leaf module but pure reshapes such as Flatten, whose
    statistics are their input's). The per-layer statistics are the main cost (about 1.4x a small CNN's
    step when taken at every step), so by default (``every=None``) they follow the doctor's adaptive
    schedule (:class:`hookscope.doctor.schedule.RecordingSchedule`: every step of the first 5, then
    every 50th, every step again while a check is suspicious), while the loss is read at every
    step; ``every=k`` records every k-th step instead (doubled when the bounded histories are thinned).
    Between recorded steps the Doctor's hooks — activations, gradients, saturation — are removed, not
    just idle. The rules run every ``check_every`` (20) steps, the first time at the end of the warm-up
    (step 5).
    ``guard=False`` leaves NaN/Inf alone (by default a ``NonFiniteGuard(select=False, quiet=True)`` joins
    the Learner beside the Doctor, as ``learn.doctor.guard``: the fit stops at the first non-finite loss
    or gradient, keeping the last good weights, and the Doctor names the module and op that made it).
    ``quiet=True`` only collects findings; ``max_print`` caps how many are printed per fit.
    ``preflight=True`` runs :func:`hookscope.preflight` at the first ``before_fit`` (not when resuming):
    its findings join the doctor's, and ``preflight_findings`` keeps them for the run folder.
    ``overlap=True`` runs only its ``train_valid_overlap`` check there (validation samples that are copies
    of training samples; ``preflight=True`` includes it).
    ``profile=True`` profiles 5 training steps after the warm-up with ``torch.profiler`` and names the
    modules that take most of the forward and backward time (``slow_layers``; nothing stays on after).
    """

    order = 15
    run_after = ("MixedPrecision",)  # gradients_ready reads unscaled gradients
    run_before = ("GradientClip", "GradientClipValue")  # ... and the norms before clipping changes them
    run_during_sweep = False  # an lr_find sweep is not the run: nothing to diagnose

    def __init__(
        self,
        select: Spec = None,
        every: int | None = None,
        check_every: int = CHECK_EVERY,
        thresholds: Thresholds | None = None,
        guard: bool = True,
        quiet: bool = False,
        max_print: int = 10,
        preflight: bool = False,
        overlap: bool = False,
        profile: bool = False,
    ) -> None:
        self.preflight, self.overlap = preflight, overlap
        self.profile = profile  # slow_layers: a profiled window at the first fit
        self.preflight_findings: list[Finding] | None = None
        self._started = False  # the first fit's data checks ran
        self.quiet = quiet
        self.engine = Engine(select, every, check_every, thresholds, quiet, max_print, owner="Doctor")
        # The loss and gradients catch every NaN/Inf that matters, and find_nonfinite names the module
        # and op on a stop: checking each layer's output every step would cost ~15% of a small CNN's.
        self.guard = NonFiniteGuard(select=False, quiet=True) if guard else None
        self._gradients_read = False  # gradients_ready ran in this batch

    @property
    def companions(self) -> list[Callback]:
        """The guard, added to the Learner beside the Doctor (and removed with it)."""
        return [self.guard] if self.guard is not None else []

    @property
    def layer_statistics(self) -> LayerStatistics:
        """The engine's activation and gradient recorders (see
        :func:`hookscope.callbacks.layer_stats.layer_statistics`)."""
        return LayerStatistics(self.engine.activations, self.engine.gradients)

    @property
    def activations(self) -> ActivationRecorder:
        """The activation statistics (``history``, ``valid_history``, ``latest()``)."""
        return self.engine.activations

    @property
    def gradients(self) -> GradientRecorder:
        """The gradient statistics (``param_history``, output-gradient ``history``)."""
        return self.engine.gradients

    @property
    def timing(self) -> TimingRecorder:
        """Where the steps' time went and memory over the run (``breakdown``, ``record()``)."""
        return self.engine.timing

    @property
    def findings(self) -> list[Finding]:
        """Every finding so far, in the order they appeared."""
        return self.engine.findings

    @property
    def thresholds(self) -> Thresholds:
        return self.engine.thresholds

    # ---- events ----------------------------------------------------------------------------------------

    def before_fit(self) -> None:
        # under torchrun every rank finds the same (reduced statistics); rank 0 prints them
        self.engine.quiet = self.quiet or not distributed.is_rank_zero()
        if not self._started and self.learn.resumed_from is None:
            self._check_data()  # before the engine's hooks: preflight trains a copy of the model
        model = self.learn.model
        self.engine.timing.compiled = compat.uncompiled(model) is not model
        self.engine.attach(compat.uncompiled(model))  # names as in the eager model
        self.engine.watch_loader(self.learn.dls.train)
        if self.profile and not self._started:
            self.engine.timing.profile_layers()
        self._started = True

    def _check_data(self) -> None:
        """The first fresh fit: does the training loader shuffle; preflight or the overlap check."""
        self.engine.add_findings(loader_not_shuffled(self.learn.dls.train))
        if self.preflight:
            self._preflight()
        elif self.overlap:
            self.engine.add_findings(train_valid_overlap(self.learn.dls.train, self.learn.dls.valid))

    def before_train(self) -> None:
        """The optimizer and the scheduler callbacks exist now (built at ``before_fit``)."""
        learn = self.learn
        self.engine.watch_optimizer(learn.opt)
        total = _length(learn.dls.train)
        self.engine.plan_run(
            total_steps=learn.n_epoch * total if total is not None else None,
            batches_per_epoch=total,
            schedulers=_schedulers(learn.cbs),
        )

    def before_batch(self) -> None:
        self._gradients_read = False
        learn = self.learn
        self.engine.begin_batch(learn.training_step, learn.training)
        if learn.yb:
            self.engine.log_target(learn.yb[0], learn.training)

    def _preflight(self) -> None:
        """hs.preflight on the Learner's model, training data and loss, with its optimizer and lr."""
        learn = self.learn
        found = preflight(learn.model, learn.dls, learn.loss_func, opt_func=learn.opt_func, lr=learn.lr)
        self.preflight_findings = found
        self.engine.add_findings(found)

    def after_loss(self) -> None:
        self.engine.log_loss(self.learn.loss, self.learn.training)

    def before_step(self) -> None:
        self._gradients_read = True
        self.engine.gradients_ready()

    def after_step(self) -> None:
        self.engine.step_done()

    def after_cancel_step(self) -> None:
        """Cancelled after the gradients were read: their norms stay. Cancelled before (MixedPrecision's
        scaler found inf gradients and skipped the step): the step did not happen, its statistics go."""
        if self._gradients_read:
            self.engine.step_cancelled()
        else:
            self.engine.discard_batch()

    def before_validate(self) -> None:
        self.engine.begin_valid()

    def after_validate(self) -> None:
        self.engine.end_valid(self.learn.training_step)

    def after_batch(self) -> None:
        if self.learn.training:
            self.engine.end_batch()

    def after_epoch(self) -> None:
        """The epoch's mean losses, which the Recorder (it runs first) has just read, feed
        ``overfitting``."""
        recorder = getattr(self.learn, "recorder", None)
        row = recorder.history[-1] if recorder is not None and recorder.history else {}
        train, valid = row.get("train_loss"), row.get("valid_loss")
        if train is not None and valid is not None:
            self.engine.log_epoch(self.learn.epoch, self.learn.training_step, train, valid)

    def after_cancel_fit(self) -> None:
        if self.guard is not None:
            self.guard.read_late(stop=False)  # its step in flight, when another callback cancelled the fit
        if self.guard is not None and self.guard.report is not None:
            self.engine.report_nonfinite(self.guard.report, self.guard.stopped_at or 0, self.guard.reason)

    def after_fit(self) -> None:
        self.engine.close()

    def on_failure(self, exc: BaseException) -> None:
        self.engine.fail()

    def wrap_method(self, event: str, method: Callable[..., Any]) -> Callable[..., Any]:
        """Another callback's handler of ``event``, timed: a stalled step names the slowest one in it."""
        owner = method_owner(method)  # under other wrappers (CallbackCost) and the callback's decorators
        if owner is self or not isinstance(owner, Callback):
            return method
        return self.timing.callback_time.wrap(f"{type(owner).__name__}.{event}", method)

    def note(self, event: str) -> None:
        """Something named ``event`` (``"checkpoint save"``) runs now: a stall of this step names it."""
        self.engine.note(event)

    # ---- checkpoint state ------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The engine's findings, histories, schedule and check position (the guard keeps its own)."""
        return self.engine.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved; the next ``fit`` continues the checks and histories."""
        self.engine.load_state_dict(state)

    # ---- checking --------------------------------------------------------------------------------------

    def check(self) -> list[Finding]:
        """Read what is pending, run every rule, print and keep the new findings; returns them."""
        return self.engine.check()

    def summary(self) -> str:
        """Every finding so far, one per line (or a line saying all is well)."""
        return self.engine.describe()


def _length(loader: Any) -> int | None:
    """Batches per epoch, when the loader knows (an iterable dataset may not)."""
    try:
        return len(loader)
    except TypeError:
        return None


def _schedulers(cbs: list[Callback]) -> list[Any]:
    """The learning-rate schedules the callbacks drive: an ``LRScheduler``'s torch scheduler (named by
    its class), a ``ParamScheduler``'s (``OneCycle``, ``CosineAnnealing``) class name."""
    found: list[Any] = []
    for cb in cbs:
        if isinstance(cb, LRScheduler) and cb.scheduler is not None:
            found.append(cb.scheduler)
        elif isinstance(cb, ParamScheduler) and "lr" in cb.scheds:
            found.append(type(cb).__name__)
    return found


def diagnose(
    learn_or_model: Learner | nn.Module,
    data: Any,
    steps: int = 20,
    loss_func: Callable[..., torch.Tensor] | None = None,
    opt_func: Callable[..., torch.optim.Optimizer] = torch.optim.AdamW,
    lr: float = 1e-3,
    quiet: bool = False,
    **doctor_kw: Any,
) -> list[Finding]:
    """Train a COPY of the model for ``steps`` steps with a :class:`Doctor` and return its findings.

    ``learn_or_model`` is a Learner (its model, loss, optimizer factory and lr are used) or a model with
    ``loss_func``. ``data`` is a DataLoader, a ``DataLoaders``/``(train, valid)`` pair (the training loader
    is used) or one ``(inputs, targets)`` batch, repeated. The user's model and optimizer are untouched.
    Data with no batch raises a ValueError; class-index targets that are all one class are a
    ``label_problem`` finding. The Doctor records every step (``every=1``) and checks every 10 steps
    unless ``doctor_kw`` says otherwise.
    """
    if isinstance(learn_or_model, Learner):
        model = learn_or_model.model
        loss_func = loss_func or learn_or_model.loss_func
        opt_func, lr = learn_or_model.opt_func, learn_or_model.lr
    else:
        model = learn_or_model
    if loss_func is None:
        raise ValueError(
            f"diagnose: no loss function for {type(model).__name__}; pass loss_func=nn.CrossEntropyLoss() "
            "(or a Learner)"
        )
    # a short probe: every step recorded (the adaptive schedule records the first 5, then every 50th)
    doctor = Doctor(quiet=quiet, **({"every": 1, "check_every": max(1, min(10, steps))} | doctor_kw))
    loader = training_loader(data, "diagnose")
    require_batches(loader, "diagnose")
    targets = _TargetRange()
    learn = Learner(
        copy.deepcopy(model),
        DataLoaders(loader, None),
        loss_func,
        opt_func,
        lr,
        cbs=[doctor, _StopAfter(steps), targets],
        progress=False,
    )
    learn.fit(math.ceil(steps / len(loader)))
    doctor.engine.add_findings(targets.findings())
    return doctor.findings


class _StopAfter(Callback):
    """Ends the fit after ``steps`` optimizer steps."""

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def after_batch(self) -> None:
        if self.learn.training and self.learn.training_step >= self.steps:
            raise CancelFitException()


class _TargetRange(Callback):
    """The smallest and largest class index of each training batch's targets, kept on the device."""

    def __init__(self) -> None:
        self.ranges: list[torch.Tensor] = []

    def before_batch(self) -> None:
        target = self.learn.yb[0] if self.learn.training and self.learn.yb else None
        if not isinstance(target, torch.Tensor) or target.is_floating_point() or target.numel() == 0:
            return
        self.ranges.append(torch.stack(torch.aminmax(target.reshape(-1).long())))

    def findings(self) -> list[Finding]:
        """A ``label_problem`` when every class index seen was the same (one read, after the run)."""
        if not self.ranges:
            return []
        ranges = torch.stack(self.ranges)
        low, high = torch.stack([ranges[:, 0].min(), ranges[:, 1].max()]).tolist()
        return rules.label_problem(low, high, len(self.ranges))
