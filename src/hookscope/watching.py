"""``hs.watch``: the doctor for a hand-written training loop (and the base of the framework integrations).

    with hs.watch(model, opt) as w:
        for x, y in loader:
            opt.zero_grad()
            loss = loss_func(model(x), y)
            w.log(loss, target=y)     # optional: the loss rules, and the label mix (no host sync)
            loss.backward()
            opt.step()
    w.findings                        # the same Finding objects as learn.doctor.findings

A :class:`Watch` drives the doctor's engine (:mod:`hookscope.doctor.engine`, the one the Learner's
``Doctor`` adapts): forward hooks on the watched layers, and, when ``optimizer`` is given, the optimizer's
step pre-hook (gradients are final: read them) and post-hook (the step happened: update ratios, close
the step, run the rules every ``check_every`` steps). Under gradient accumulation that is once per
optimizer step; ``GradScaler.step`` calls ``opt.step`` only after unscaling, so gradients are read
unscaled, and a step it skips (inf gradients) never reaches the hooks, so it is not counted. Without an
optimizer, a loop that updates the weights by hand puts its update in ``with w.optimizer_step():``, and a
framework callback calls :meth:`Watch.gradients_ready` and :meth:`Watch.step_done` itself.

The mistakes of the loop around the model (a missing ``zero_grad``, training in eval mode, the same
batch every step, graphs kept alive, a collapsing learning rate) are checked from the same hooks; the
label mix of ``unshuffled_data`` needs the targets, given with ``w.log(loss, target=y)``. A loop that
knows its length or its schedulers says so with :meth:`Watch.plan_run`. Where the time goes
(``input_bound``, ``step_stalls``, ``memory_growth``, ``page_faults``) is timed from the same hooks;
``loader=`` (or :meth:`Watch.watch_loader`) hands over the training DataLoader, whose settings
``input_bound`` then names (a Watch cannot see the loader the loop iterates), and :meth:`Watch.note` names
a slow part of the loop (``w.note("checkpoint save")`` before ``torch.save``).

Only training forwards are recorded: a module in train mode with autograd on. Validation (``model.eval()``
or ``torch.no_grad()``) is ignored; the Learner's Doctor diagnoses validation phases, a loop without
phases has none to give.
"""

from __future__ import annotations

import contextlib
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple

import torch
from torch import nn

from hookscope import compat
from hookscope._deprecation import renamed_keywords
from hookscope.doctor.engine import CHECK_EVERY, Engine
from hookscope.doctor.findings import Finding, Findings, Thresholds
from hookscope.doctor.guard import BatchJournal, LateVerdict, NonFiniteCheck, reads_late, stop_message
from hookscope.doctor.record_types import ParamRecord, StepStats
from hookscope.doctor.selection import module_in_training
from hookscope.hooks.handles import HookSet
from hookscope.hooks.nonfinite import NonFiniteReport
from hookscope.hooks.select import Spec
from hookscope.hooks.tensors import model_device
from hookscope.train import distributed

# A loop without batch events: each forward says whether it trains; errors name hs.watch.
_WATCH_ENGINE: dict[str, Any] = {"training_of": module_in_training, "owner": "hs.watch"}
# The open Watch of each model: a second one would double every hook and every statistic.
_OPEN: weakref.WeakKeyDictionary[nn.Module, Watch] = weakref.WeakKeyDictionary()


class NonFiniteError(RuntimeError):
    """``hs.watch(..., guard=True)``: a NaN/Inf reached an activation, the loss or a gradient.

    Raised from the optimizer's step pre-hook, so the step never ran and the weights are those of the
    last good step. ``report`` is the :class:`~hookscope.NonFiniteReport` of the replay (module, op,
    phase), ``step`` the optimizer step and ``reason`` which check failed first (``"activation"``,
    ``"loss"`` or ``"gradient"``). The Watch is closed when it is raised.
    """

    def __init__(self, message: str, report: NonFiniteReport, step: int, reason: str) -> None:
        super().__init__(message)
        self.report, self.step, self.reason = report, step, reason


def watch(model: nn.Module, optimizer: torch.optim.Optimizer | None = None, **options: Any) -> Watch:
    """Watch ``model`` while a hand-written loop trains it: ``hs.watch(model, opt, doctor=True, stats=True,
    guard=False, select=None, every=None, check_every=20, thresholds=None, quiet=False, path=None,
    loader=None)``; the options are keyword-only, see :class:`Watch`."""
    return Watch(model, optimizer, **options)


class Watch:
    """The doctor attached to ``model`` (and ``optimizer``) until :meth:`close` or the end of a ``with``.

    ``doctor``: run the rules and print findings as they appear (same one-line format as the Doctor);
    ``stats``: record the per-layer statistics (``activations``, ``gradients``, ``param_history``), which
    the doctor reads; ``guard``: check every step for NaN/Inf and raise :class:`NonFiniteError` before a
    bad update lands. ``late`` says when the guard's verdict is read, as for ``NonFiniteGuard``: None (the
    default) a step late where ``optimizer`` is a fused one (it then leaves the bad update out on the
    device) and the model is not on the CPU, so the guard makes no host sync; True a step late on any
    device; False before each step. ``select``, ``every``, ``check_every``, ``thresholds`` and ``quiet``
    mean what they mean for ``hs.callbacks.Doctor``: by default (``every=None``) the per-layer statistics
    follow the same adaptive schedule, cheap enough to leave on; ``every=1`` records every optimizer step.
    ``path``: a folder that receives, at close, the run folder and ``report.html`` a Learner's
    ``RunFolder`` writes (an existing run there is refused, as by RunFolder). ``loader``: the training
    DataLoader, whose settings ``input_bound`` names (see :meth:`watch_loader`).
    """

    @renamed_keywords(report="path")
    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        doctor: bool = True,
        stats: bool = True,
        guard: bool = False,
        late: bool | None = None,
        select: Spec = None,
        every: int | None = None,
        check_every: int = CHECK_EVERY,
        thresholds: Thresholds | None = None,
        quiet: bool = False,
        path: str | Path | None = None,
        loader: Any = None,
    ) -> None:
        _refuse_bad_arguments(model, optimizer, doctor, stats)
        # A torch.compile'd model: hook the user's module, so names read as in their code (no _orig_mod.)
        compiled = compat.uncompiled(model) is not model
        model = compat.uncompiled(model)
        if model in _OPEN:
            raise RuntimeError(
                f"hs.watch: this {type(model).__name__} is already watched by an open Watch; close that one "
                "first (leave its with-block or call .close()) — a second Watch would double every hook"
            )
        self.model, self.optimizer = model, optimizer
        self._stepper = optimizer  # the optimizer a late verdict is handed to (see follow_optimizer)
        self.options: dict[str, Any] = dict(model=type(model).__name__, doctor=doctor, stats=stats)
        self.options |= dict(guard=guard, every=every, check_every=check_every, select=repr(select))
        self.step = 0
        self._late = guard and _reads_late(optimizer, late, model_device(model))  # before the lock is taken
        # the run folder's writer lock, held from here to the folder's write at close (one writer per folder)
        self._report_lock = _lock_report_folder(path) if path is not None else None
        self.report_path = Path(path) if path is not None else None
        self._engine = None
        if stats:
            settings = dict(select=select, every=every, check_every=check_every, thresholds=thresholds)
            self._engine = Engine(**settings, quiet=quiet, diagnose=doctor, **_WATCH_ENGINE)
            self._engine.timing.compiled = compiled
        self.watch_loader(loader)
        self._guard = NonFiniteCheck(None, training=module_in_training) if guard else None
        self._hooks = HookSet()
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._device = model_device(model)
        self._backward_seen = False  # gradients arrived since the last step closed
        self._journal = BatchJournal(self._device)  # the forwards of this step, for the guard's replay
        self._in_flight: _InFlight | None = None  # the step whose verdict is on its way (read late)
        self._no_checks: list[Callable[[list[Finding]], None]] = []  # after_check without an engine
        self._closed = False
        self._started = time.time()
        self._started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        _OPEN[model] = self
        try:
            self._attach()
        except BaseException:
            self.close()
            raise

    # ---- what a loop reads ---------------------------------------------------------------------------

    @property
    def findings(self) -> Findings:
        """Every finding so far, in the order they appeared."""
        return self._engine.findings if self._engine is not None else Findings()

    @property
    def activations(self) -> dict[str, list[StepStats]]:
        """Activation statistics per watched layer, one record per recorded optimizer step."""
        return self._engine.activations.history if self._engine is not None else {}

    @property
    def gradients(self) -> dict[str, list[StepStats]]:
        """Statistics of the gradient flowing out of each watched layer, one record per recorded step."""
        return self._engine.gradients.history if self._engine is not None else {}

    @property
    def param_history(self) -> dict[str, list[ParamRecord]]:
        """Gradient norm and update ratio per trainable parameter, one record per recorded step."""
        return self._engine.gradients.param_history if self._engine is not None else {}

    @property
    def after_check(self) -> list[Callable[[list[Finding]], None]]:
        """Functions called with the new findings at the end of every check (the rules' run every
        ``check_every`` steps, :meth:`check`, the final one at close); append to it to act then. None
        is called with ``stats=False``: no check runs."""
        return self._engine.after_check if self._engine is not None else self._no_checks

    # ---- what a loop calls ---------------------------------------------------------------------------

    def log(self, loss: torch.Tensor, target: Any = None) -> None:
        """Feed this batch's loss to the loss rules (and the guard), and its ``target`` (class indices) to
        the label-mix check of ``unshuffled_data``; both stay on the device."""
        if self._closed:
            return
        training = module_in_training(self.model)
        if self._engine is not None:
            self._engine.log_loss(loss, training)
            if target is not None:
                self._engine.log_target(target, training)
        if self._guard is not None and training:
            self._guard.loss(loss)

    def plan_run(
        self, total_steps: int | None = None, batches_per_epoch: int | None = None, schedulers: Any = ()
    ) -> None:
        """What the loop knows of the run ahead: its length in optimizer steps (without it, an early
        learning-rate collapse is named once the run is ten times as long as the collapse is late),
        batches per epoch (1 turns ``repeated_batch`` off: one batch per epoch repeats by design) and
        its learning-rate schedulers, to name them in ``lr_schedule``."""
        if self._engine is not None:
            self._engine.plan_run(total_steps, batches_per_epoch, schedulers)

    def follow_optimizer(self, optimizer: torch.optim.Optimizer, late: bool = False) -> None:
        """The optimizer whose parameters and learning rates ``stale_gradients``, ``lr_schedule`` and
        ``not_updated`` read, for a loop that calls :meth:`gradients_ready` and :meth:`step_done` itself
        (the integrations); ``hs.watch(model, optimizer)`` follows its optimizer already. ``late``: the
        guard hands its verdict to ``optimizer`` and reads it a step late, as with ``hs.watch(model,
        optimizer, late=...)`` (the caller has decided it can: :func:`hookscope.doctor.guard.reads_late`)."""
        if self._engine is not None:
            self._engine.watch_optimizer(optimizer)
        if self._guard is not None and self.optimizer is None:
            self._stepper, self._late = optimizer, late

    def watch_loader(self, loader: Any) -> None:
        """The training DataLoader (None: none): ``input_bound`` names its ``num_workers``,
        ``pin_memory``, ``persistent_workers`` and ``prefetch_factor``, ``step_stalls`` its epoch length."""
        if self._engine is not None and loader is not None:
            self._engine.watch_loader(loader)

    def note(self, event: str) -> None:
        """Something named ``event`` (``"checkpoint save"``) runs now: if this step stalls, the finding
        names it."""
        if self._engine is not None and not self._closed:
            self._engine.note(event)

    def gradients_ready(self) -> None:
        """The gradients are final (unscaled) for this optimizer step: check and read them now."""
        if self._closed:
            return
        if self._guard is not None:
            self._read_late()
            self._judge()
        if self._engine is not None:
            self._engine.gradients_ready()

    def _judge(self) -> None:
        """The guard's verdict on this step: handed to a fused optimizer and read a step late, or read
        now (a "no" raises before the step runs)."""
        assert self._guard is not None
        opt = self._stepper
        late = self._late and opt is not None and compat.skips_steps_on_device(opt)
        verdict = self._guard.flag(self._params, self._device) if late else None
        if verdict is None:
            reason = self._guard.decide(self._params, self._device)
            if reason is not None:
                self._stop(reason, self._journal, self.step)
            return
        compat.skip_step_if(opt, verdict.flag.found)
        self._in_flight = _InFlight(verdict, self._journal, self.step)
        self._journal = BatchJournal(self._device)

    def _read_late(self) -> None:
        """Read the verdict of the step in flight; a failed one raises :class:`NonFiniteError` for it."""
        flight, self._in_flight = self._in_flight, None
        if flight is not None and flight.verdict.failed():
            self._stop(flight.verdict.reason(), flight.journal, flight.step)

    def step_done(self) -> None:
        """The optimizer stepped: update ratios, close the step, run the rules every ``check_every``."""
        if self._closed:
            return
        if self._late and self._stepper is not None:
            compat.skip_step_if(self._stepper, None)
        if self._engine is not None:
            self._engine.step_done()
            self._engine.end_batch()
        self.step += 1
        self._next_step()

    @contextlib.contextmanager
    def optimizer_step(self) -> Iterator[None]:
        """The optimizer step of a loop that has no optimizer object and updates the weights by hand
        (``p.data.add_(p.grad, alpha=-lr)``, as the PyTorch examples' word language model does): put the
        update in ``with w.optimizer_step():``. The gradients are read on entry, as an optimizer's step
        pre-hook reads them, and the step is closed on exit (update ratios, the rules every
        ``check_every`` steps); a body that raises closes no step. With an optimizer given, its own
        hooks count its steps: a RuntimeError says so."""
        if self.optimizer is not None:
            raise RuntimeError(
                f"hs.watch: optimizer_step() marks a hand-written update, but this Watch follows "
                f"{type(self.optimizer).__name__}.step() already; remove the with-block"
            )
        self.gradients_ready()
        yield
        self.step_done()

    def skip_step(self) -> None:
        """The optimizer step was skipped (a grad scaler found inf): forget this step's statistics."""
        if self._closed:
            return
        if self._engine is not None:
            self._engine.discard_batch()
        if self._guard is not None:
            self._guard.clear()
        self._next_step()

    def check(self) -> list[Finding]:
        """Read what is pending and run the rules now; returns the new findings."""
        return self._engine.check() if self._engine is not None and not self._closed else []

    def close(self) -> None:
        """Final check, then every hook is removed (also the optimizer's); the report folder is written.
        Calling it again does nothing."""
        self._shut(None)

    def __enter__(self) -> Watch:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._shut(exc)

    # ---- machinery -----------------------------------------------------------------------------------

    def _attach(self) -> None:
        if self._engine is not None:
            self._engine.attach(self.model)
            self._engine.begin_batch(0, training=True)
        if self._guard is not None:
            self._guard.attach(self.model)
        self._hooks.forward_pre(self.model, self._before_forward, with_kwargs=True)
        if self.optimizer is None:
            return
        self.follow_optimizer(self.optimizer)
        self._hooks.add(self.optimizer.register_step_pre_hook(lambda *_: self.gradients_ready()))
        self._hooks.add(self.optimizer.register_step_post_hook(lambda *_: self.step_done()))
        for p in self._params:
            self._hooks.param(p, self._gradient_arrived)

    def _next_step(self) -> None:
        self._backward_seen = False
        self._journal.clear()
        if self._engine is not None:
            self._engine.begin_batch(self.step, training=True)

    def _before_forward(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if not module_in_training(module):
            return
        if self._backward_seen and not any(p.grad is not None for p in self._params):
            # A backward, then no optimizer step and the gradients zeroed: a grad scaler skipped the step.
            self.skip_step()
        if self._guard is not None:
            self._journal.record(args, kwargs)

    def _gradient_arrived(self, param: nn.Parameter) -> None:
        self._backward_seen = True

    def _stop(self, reason: str, journal: BatchJournal, step: int) -> None:
        """The guard said no to ``step``: blame its batches, report it, close, and raise before the step
        runs (read late: before the next one runs; the bad one left its update out on the device)."""
        self._unhook(failed=True)  # the replay must not be recorded
        if self._stepper is not None:
            compat.skip_step_if(self._stepper, None)
        report = journal.blame(self.model, loss_func=None)  # the loop's loss is unknown here
        if self._engine is not None:
            self._engine.report_nonfinite(report, step, reason)
        for p in self._params:
            p.grad = None  # a caught error must not leave NaN gradients to accumulate into
        stopped = f"hs.watch stopped optimizer step {step}"
        message = stop_message(stopped, step, reason, report, with_loss=False)
        error = NonFiniteError(message, report, step, reason)
        self._shut(error)
        raise error

    def _unhook(self, failed: bool) -> None:
        self._hooks.remove()
        if self._guard is not None:
            self._guard.detach()
        if self._engine is not None and failed:
            self._engine.fail()

    def _shut(self, exc: BaseException | None) -> None:
        if self._closed:
            return
        if exc is None:
            self._read_late()  # the loop's last step: a failed one raises its NonFiniteError from here
        self._closed = True
        try:
            self._unhook(failed=exc is not None)
        finally:
            _OPEN.pop(self.model, None)
        self._final_check(exc)
        if self.report_path is not None:
            self._write_report(exc)

    def _final_check(self, exc: BaseException | None) -> None:
        if self._engine is None:
            return
        if exc is None:
            self._engine.close()
            return
        try:  # after an error: report what was found, never mask the error
            self._engine.check()
        except Exception as err:
            warnings.warn(f"hs.watch: the final check failed ({type(err).__name__}: {err})", stacklevel=3)

    def _write_report(self, exc: BaseException | None) -> None:
        assert self.report_path is not None and self._report_lock is not None
        status = "complete" if exc is None else "stopped" if isinstance(exc, NonFiniteError) else "failed"
        config = {
            "source": "hs.watch",
            "model": type(self.model).__name__,
            "optimizer": type(self.optimizer).__name__ if self.optimizer is not None else None,
            "options": self.options,
            "steps": self.step,
            "started": self._started_at,
            "status": status,
            "duration_s": time.time() - self._started,
        }
        if exc is not None:
            config["error"] = f"{type(exc).__name__}: {exc}"
        engine = self._engine
        try:
            self._write_folder(config, engine)
        finally:
            self._report_lock.release()  # also when the write was refused

    def _write_folder(self, config: dict[str, Any], engine: Any) -> None:
        from hookscope.run_writer import write_watch_folder  # matplotlib loads only when a report is asked

        write_watch_folder(
            self.report_path,
            config,
            self.findings,
            engine.activations if engine is not None else None,
            engine.gradients if engine is not None else None,
            [value for _, value in engine.loss_history] if engine is not None else [],
            self.model,
            engine.timing if engine is not None and engine.diagnose_enabled else None,
            lock=self._report_lock,
        )


class _InFlight(NamedTuple):
    """A step whose guard verdict is on its way to the host, with its batches and its number."""

    verdict: LateVerdict
    journal: BatchJournal
    step: int


def _reads_late(optimizer: torch.optim.Optimizer | None, late: bool | None, device: torch.device) -> bool:
    """Whether the guard hands its flag to ``optimizer`` and reads it a step late (see :class:`Watch`)."""
    name = type(optimizer).__name__ if optimizer is not None else "no optimizer"
    refusal = (
        f"hs.watch(late=True): {name} cannot skip a step on the device; pass a fused optimizer "
        "(e.g. torch.optim.AdamW(params, fused=True)) or leave late=None"
    )
    return reads_late(optimizer, late, device, refusal)


def _refuse_bad_arguments(model: Any, optimizer: Any, doctor: bool, stats: bool) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"hs.watch: model must be a torch.nn.Module, not {type(model).__name__}")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"hs.watch: optimizer must be a torch.optim.Optimizer (or None, when your loop calls "
            f"gradients_ready() and step_done() itself), not {type(optimizer).__name__}"
        )
    if doctor and not stats:
        raise ValueError(
            "hs.watch: doctor=True reads the statistics that stats=False turns off; pass stats=True, "
            "or doctor=False for the guard alone"
        )
    distributed.refuse_fsdp1(model, "hs.watch")


def _lock_report_folder(report: str | Path) -> Any:
    """Take the run folder's writer lock and refuse a folder RunFolder would refuse, now rather than after
    training; the lock is held until the folder is written (or the process ends)."""
    from hookscope.staged_folder import StagedFolder

    lock = StagedFolder.acquire(StagedFolder.lock_for(report))
    try:
        StagedFolder.check_start(report, "train", lock=lock)
    except BaseException:
        lock.release()
        raise
    return lock
