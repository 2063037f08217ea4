"""The doctor's engine: which statistics to keep, when to record and read them, the rules, the findings.

One engine serves every loop, and every loop feeds it the same way: explicit calls —
:meth:`Engine.begin_batch` (training or not, which step), :meth:`~Engine.log_loss`,
:meth:`~Engine.gradients_ready` (gradients are final: unscaled, not yet clipped), :meth:`~Engine.step_done`
(the optimizer stepped), :meth:`~Engine.step_cancelled` or :meth:`~Engine.discard_batch`,
:meth:`~Engine.end_batch` (the step ends), :meth:`~Engine.begin_valid` / :meth:`~Engine.end_valid`,
:meth:`~Engine.close` — made by the Learner's ``Doctor`` callback, ``hs.watch`` and the integrations from
their loop's events.

The engine owns five recorders — activations and gradients (:mod:`hookscope.doctor.recorders`),
saturation (:mod:`hookscope.doctor.saturation`) and, when it diagnoses, the loop's protocol
(:mod:`hookscope.doctor.protocol`: zero_grad, modes, batches, graphs, the learning-rate schedule; fed
:meth:`~Engine.log_target` and :meth:`~Engine.plan_run` too) and where the time and memory go
(:mod:`hookscope.doctor.timing`: ``input_bound``, ``step_stalls``, ``memory_growth``, ``page_faults``; fed
:meth:`~Engine.watch_loader` and :meth:`~Engine.note` too) — and drives them with every feed call.
Whether a training step is recorded is decided once, in :meth:`~Engine.begin_batch`, by the engine's
:class:`~hookscope.doctor.schedule.Cadence`, and handed to each recorder as a boolean.

Every ``check_every`` training steps (20 by default; the first at the end of the recording warm-up, and
the last at :meth:`~Engine.close`), :meth:`~Engine.check` reads everything pending to the host
(:meth:`~Engine.read_pending`, the one place where device statistics become host numbers) and runs the
rules of :mod:`hookscope.doctor.rules` (:meth:`~Engine.diagnose`, the one place where rules run). New
findings go to the :class:`~hookscope.doctor.finding_log.FindingLog`, which prints each once and keeps
them in ``findings``. Every history the engine keeps is bounded (the recorders', the loss history's:
:mod:`hookscope.doctor.loss_history`), in memory and in checkpoints.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from hookscope.doctor import rules
from hookscope.doctor.adversaries import Adversaries
from hookscope.doctor.finding_log import FindingLog
from hookscope.doctor.findings import Finding, Thresholds
from hookscope.doctor.loss_history import LossHistory
from hookscope.doctor.protocol import ProtocolRecorder
from hookscope.doctor.recorders import ActivationRecorder, GradientRecorder
from hookscope.doctor.saturation import SaturationRecorder
from hookscope.doctor.schedule import Cadence
from hookscope.doctor.selection import PASS_THROUGH, RESHAPES, TrainingOf, computing_leaves
from hookscope.doctor.timing import TimingRecorder
from hookscope.hooks.nonfinite import NonFiniteReport
from hookscope.hooks.select import Spec
from hookscope.hooks.stats import several_ranks, to_host

# Records kept of each epoch's losses and of each validation phase: they grow by one an epoch, not a step;
# ``overfitting`` and ``nonfinite_validation`` read the recent ones, so the oldest go past this bound.
PER_EPOCH_RECORDS = 1024
# Training steps between two checks. A check costs about the same on any model (0.6-1 ms on a CPU: the
# bulk read and the rules), so it is a share of a short step; 20 halves that share against 10, and the
# first check comes at the warm-up's end (step 5 of the adaptive schedule), where the faults of the
# initialisation are found.
CHECK_EVERY = 20


class Engine:
    """The doctor, loop-independent: statistics, rules, findings, deduplication and printing.

    ``select`` picks the layers watched (None: every leaf module but pure reshapes, see
    :func:`~hookscope.doctor.selection.computing_leaves`); statistics are taken every ``every``
    training steps (doubled when the bounded histories are thinned) — ``every=None``: on the adaptive
    :class:`~hookscope.doctor.schedule.RecordingSchedule` (every step at first, then sparsely, densely
    again while a check is suspicious) — and the rules run every ``check_every`` steps (and at
    the end of the adaptive schedule's warm-up); the loss is read at every step. ``quiet=True`` only
    collects findings; ``max_print`` caps how many are printed. ``diagnose=False`` records without
    running the rules. ``training_of``: None when the loop says whether a batch trains
    (:meth:`begin_batch`); a function of the module when it cannot (``hs.watch`` asks each forward).
    ``owner`` names the caller in errors.
    """

    def __init__(
        self,
        select: Spec = None,
        every: int | None = 1,
        check_every: int = CHECK_EVERY,
        thresholds: Thresholds | None = None,
        quiet: bool = False,
        max_print: int = 10,
        diagnose: bool = True,
        training_of: TrainingOf = None,
        owner: str = "Doctor",
    ) -> None:
        if check_every < 1:
            raise ValueError(f"{owner}: check_every={check_every}; use check_every >= 1")
        self.cadence = Cadence(every, owner)
        select = computing_leaves if select is None else select
        self.thresholds = thresholds or Thresholds()
        self.check_every = check_every
        self.log = FindingLog(quiet, max_print)
        self.diagnose_enabled = diagnose
        # include_valid: one record per validation phase, whose non-finite counts name the layer that
        # first made a NaN/Inf on the validation data (read in the bulk transfers of check()).
        self.activations = ActivationRecorder(
            select=select, include_valid=True, read_every=check_every, owner=owner
        )
        self.gradients = GradientRecorder(
            select=select, output_grads=True, read_every=check_every, owner=owner
        )
        self.saturation = SaturationRecorder(self.thresholds.saturation_margin)
        self.adversaries = Adversaries()  # another optimizer playing against the loss: a game
        self._statistics = (self.activations, self.gradients, self.saturation)
        self.training_of = training_of
        for recorder in self._statistics:
            recorder.training_of = training_of
        # the protocol's checks are rules with hooks of their own: recording without rules needs none
        self.protocol = ProtocolRecorder()
        self.timing = TimingRecorder()
        self._every_step = (self.protocol, self.timing) if diagnose else ()
        self._recorders = self._statistics + self._every_step
        # The statistics recorders follow the batch: true from a recorded training step or another batch
        # to the next training step that is not recorded. Between two records they have nothing to do
        # (their hooks are off), so they are not called: each call inside a step costs several times its
        # time outside one (the step's tensors push the interpreter out of the caches).
        self._statistics_follow = True
        self.losses = LossHistory()
        # called with the new findings at the end of every check: an adapter logs or acts then
        self.after_check: list[Callable[[list[Finding]], None]] = []
        self.valid_phases: list[tuple[int, int, int]] = []
        self.epoch_losses: list[tuple[int, int, float, float]] = []
        self.optimizer: torch.optim.Optimizer | None = None
        self._params: dict[str, nn.Parameter] = {}
        self._in_valid = False
        self._step = 0
        self._losses: list[tuple[int, torch.Tensor]] = []
        self._valid_losses: list[torch.Tensor] = []
        self._pending_valid: list[tuple[int, int, torch.Tensor]] = []
        self._steps_since_check = 0
        self._checked_step = -1  # the training step of the last check
        self._last_warmup_step = self.cadence.warmup - 1  # -1 without a warm-up (a fixed cadence)
        self._sizes: dict[str, int] = {}
        self._matrices: set[str] = set()
        self._reshapes: set[str] = set()
        self._pass_through: set[str] = set()
        # The record rules' findings per Thresholds, valid while the histories they read stay unchanged.
        self._rules_memo: dict[Thresholds, list[Finding]] = {}
        self._rules_basis: tuple[int, ...] = ()
        # The loss rules' state: a divergence scan per (window, factor); the stall rule's last result.
        self._scans: dict[tuple[int, float], rules.DivergenceScan] = {}
        self._stall_memo: tuple[Thresholds, int, list[Finding]] | None = None

    @property
    def findings(self) -> list[Finding]:
        """Every finding so far, in the order they appeared."""
        return self.log.findings

    @property
    def quiet(self) -> bool:
        return self.log.quiet

    @quiet.setter
    def quiet(self, value: bool) -> None:
        self.log.quiet = value

    @property
    def loss_history(self) -> list[tuple[int, float]]:
        """The training losses the loss rules read: ``(step, loss)``, bounded (see
        :mod:`hookscope.doctor.loss_history`)."""
        return self.losses.entries

    @property
    def saturation_history(self) -> dict[str, list[tuple[int, float]]]:
        """``(step, saturated share)`` per tanh/sigmoid layer, one per recorded step, bounded."""
        return self.saturation.history

    # ---- feed ----------------------------------------------------------------------------------------

    def attach(self, model: nn.Module) -> None:
        """Hook ``model`` (every recorder) and report frozen parameters."""
        self.saturation.margin = self.thresholds.saturation_margin
        for recorder in self._recorders:
            recorder.attach(model)
        self._statistics_follow = True
        self.adversaries.attach(model)
        self._sizes = {name: p.numel() for name, p in model.named_parameters()}
        self._params = dict(model.named_parameters())
        self._matrices = {name for name, p in model.named_parameters() if p.dim() >= 2}
        self._reshapes = {name for name, m in model.named_modules() if isinstance(m, RESHAPES)}
        self._pass_through = {name for name, m in model.named_modules() if isinstance(m, PASS_THROUGH)}
        self._rules_basis = ()  # sizes and layer kinds are the new model's: the record rules run again
        frozen: dict[str, int] = {}
        for name, p in model.named_parameters():
            if not p.requires_grad:
                module = name.rpartition(".")[0]
                frozen[module] = frozen.get(module, 0) + p.numel()
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        if self.diagnose_enabled:
            self.add_findings(rules.frozen(frozen, trainable))

    def begin_batch(self, step: int, training: bool) -> None:
        """A batch starts: a training batch of optimizer step ``step``, or (``training=False``) another.
        The cadence decides here, once, whether a training step is recorded."""
        recorded = False
        if training:
            self._step = step
            recorded = self.cadence(step)
        if recorded or not training or self._statistics_follow:
            for recorder in self._statistics:
                recorder.begin_batch(step, training, recorded)
        self._statistics_follow = recorded or not training
        for recorder in self._every_step:
            recorder.begin_batch(step, training, recorded)

    def plan_run(
        self, total_steps: int | None = None, batches_per_epoch: int | None = None, schedulers: Any = ()
    ) -> None:
        """What the loop knows of the run ahead: its length in optimizer steps (``lr_schedule`` judges an
        early collapse against it), batches per epoch (1: ``repeated_batch`` is off, one batch repeats
        by design) and its learning-rate schedulers (objects with an ``optimizer``, or names), to name."""
        self.protocol.plan_run(total_steps, batches_per_epoch, schedulers)

    def log_target(self, target: Any, training: bool) -> None:
        """The batch's targets (class indices feed ``unshuffled_data``; one device copy, no host sync)."""
        if self.diagnose_enabled:
            self.protocol.log_target(target, training)

    def log_loss(self, loss: torch.Tensor, training: bool) -> None:
        """The batch's loss (a device tensor; no host sync): the loss rules read the training ones, the
        validation phase counts non-finite ones."""
        if self.diagnose_enabled:
            self.timing.log_loss(loss, training)
        if training:
            loss = loss.detach()
            self._losses.append((self._step, loss if loss.dtype == torch.float32 else loss.float()))
        elif self._in_valid:
            self._valid_losses.append(loss.detach())

    def gradients_ready(self) -> None:
        """The gradients of this optimizer step are final (unscaled, before clipping)."""
        if self._statistics_follow:
            self.gradients.gradients_ready()
        self.protocol.gradients_ready()
        self.timing.gradients_ready()
        self.adversaries.watched_step()

    def step_done(self) -> None:
        """The optimizer stepped (update ratios are measured around it)."""
        if self._statistics_follow:
            self.gradients.step_done()
        self.protocol.step_done()
        self.timing.step_done()

    def step_cancelled(self) -> None:
        """The step was cancelled after :meth:`gradients_ready`: the norms stay, without a ratio."""
        if self._statistics_follow:
            self.gradients.step_cancelled()
        self.protocol.step_cancelled()
        self.timing.step_cancelled()

    def discard_batch(self) -> None:
        """The step did not happen (a grad scaler skipped it): forget its statistics windows."""
        for recorder in self._recorders:
            recorder.discard_batch()

    def end_batch(self) -> None:
        """The training step ends: close its windows; every ``check_every`` steps, and at the end of the
        recording warm-up (its records complete), run :meth:`check`."""
        if self._statistics_follow:
            for recorder in self._statistics:
                recorder.end_batch()
        for recorder in self._every_step:
            recorder.end_batch()
        self._steps_since_check += 1
        # the warm-up's last step, its records complete, is checked once (under gradient accumulation
        # it has several batches); compared inline: this runs at every step
        warmup_ends = self._step == self._last_warmup_step and self._checked_step != self._step
        if self._steps_since_check >= self.check_every or warmup_ends:
            self.check()
            self.timing.leave_out()  # the doctor's own check is no part of the next step

    def begin_valid(self) -> None:
        self.activations.begin_valid()
        self.protocol.begin_valid()
        self.timing.begin_valid()
        self._valid_losses, self._in_valid = [], True

    def end_valid(self, step: int) -> None:
        """Count the phase's non-finite batch losses on the device; :meth:`check` reads the count."""
        self.activations.end_valid(step)
        self.protocol.end_valid(step)
        self.timing.end_valid(step)
        losses, self._valid_losses, self._in_valid = self._valid_losses, [], False
        if losses:
            bad = torch.stack([loss.float().sum() for loss in losses]).isfinite().logical_not().sum()
            self._pending_valid.append((step, len(losses), bad))

    def log_epoch(self, epoch: int, step: int, train_loss: float, valid_loss: float) -> None:
        """An epoch ended at training step ``step`` with these mean losses (host numbers the loop already
        read): the ``overfitting`` rule compares them across epochs at the next check."""
        self.epoch_losses.append((epoch, step, float(train_loss), float(valid_loss)))
        del self.epoch_losses[:-PER_EPOCH_RECORDS]

    def record_losses(self, losses: Iterable[tuple[int, float]]) -> None:
        """Training losses already on the host, ``(step, loss)``, oldest first: what a check does with
        the ones :meth:`log_loss` collected (the loss history and the divergence scans take them)."""
        losses = list(losses)
        self.losses.extend(losses)
        for scan in self._scans.values():
            scan.update(losses)

    def watch_optimizer(self, optimizer: torch.optim.Optimizer | None) -> None:
        """The optimizer stepping the model: ``not_updated`` then says whether a parameter that never
        changes is missing from it or sits in a group with learning rate 0; ``stale_gradients`` and
        ``lr_schedule`` watch its parameters and learning rates; another optimizer is told from it
        (:mod:`hookscope.doctor.adversaries`)."""
        self.optimizer = optimizer
        self.protocol.watch_optimizer(optimizer)
        self.adversaries.watch_optimizer(optimizer)

    def watch_loader(self, loader: Any) -> None:
        """The training DataLoader: ``input_bound`` names its settings, ``step_stalls`` its epoch length."""
        self.timing.watch_loader(loader)

    def note(self, event: str) -> None:
        """Something named ``event`` (``"checkpoint save"``) runs now: a stall of this step names it."""
        if self.diagnose_enabled:
            self.timing.note(event)

    def report_nonfinite(self, report: NonFiniteReport, step: int, reason: str | None) -> list[Finding]:
        """The guard stopped at ``step``: its blame becomes a finding."""
        return self.add_findings(rules.nonfinite(report, step, reason))

    def close(self) -> list[Finding]:
        """Remove every hook, read what is pending and run the rules a last time; returns new findings."""
        for recorder in self._recorders:
            recorder.close()
        self.adversaries.close()
        self._stall_memo = None  # the last check sees the whole history
        return self.check()

    def fail(self) -> None:
        """Remove every hook after an error; the open windows are dropped."""
        for recorder in self._recorders:
            recorder.fail()
        self.adversaries.close()

    # ---- checking ------------------------------------------------------------------------------------

    def check(self) -> list[Finding]:
        """Read what is pending, run every rule, print and keep the new findings, hand them to each
        ``after_check`` listener; returns them."""
        self._steps_since_check, self._checked_step = 0, self._step
        self.read_pending()
        new: list[Finding] = []
        if self.diagnose_enabled:
            new = self.add_findings(self.diagnose())
            schedule = self.cadence.schedule
            if schedule is not None and self._suspicious():
                schedule.tighten(self._step + 1 + self.check_every)
        for listener in self.after_check:
            listener(new)
        return new

    def read_pending(self) -> None:
        """Every pending device statistic to the host: the recorders' and the engine's own (the step
        times wait for the timing's rules, every 50 steps: :meth:`TimingRecorder.findings`)."""
        self.activations.flush()
        self.gradients.flush()
        self._read_own()
        self._follow_thinnings()

    def _follow_thinnings(self) -> None:
        """The histories may have been thinned (only reads thin them): a fixed interval doubles with them."""
        self.cadence.follow(max(recorder.thinnings for recorder in self._recorders))

    def diagnose(self) -> list[Finding]:
        """Every rule on the host histories (read them first: :meth:`read_pending`)."""
        th = self.thresholds
        if self.adversaries.game:  # the loss is a game: not meant to fall, only a collapse is news
            th = replace(th, divergence_factor=max(th.divergence_factor, th.game_divergence_factor))
        return [
            *self._divergence(th),
            *(self._stalled(th) if not self.adversaries.game else []),
            *rules.overfitting(self.epoch_losses, th),
            *self._record_rules(th),
            *rules.nonfinite_validation(self.valid_phases, self.activations.valid_history),
            *self.protocol.findings(),
            # a game's other player steps between two watched steps: no wait for data to measure there
            *self.timing.findings(data_is_waiting=not self.adversaries.game),
        ]

    def _record_rules(self, th: Thresholds) -> list[Finding]:
        """The rules on the recorded statistics (those the schedule samples), run again only when the
        histories changed since they last ran at ``th``: between two sparse records (most checks of the
        default schedule) they would find the same."""
        basis = (
            self.activations.version,
            self.gradients.version,
            self.saturation.version,
            id(self.optimizer),
            len(self.adversaries.parameters),
        )
        if basis != self._rules_basis:
            self._rules_basis, self._rules_memo = basis, {}
        if th not in self._rules_memo:
            self._rules_memo[th] = self._run_record_rules(th)
        return self._rules_memo[th]

    def _run_record_rules(self, th: Thresholds) -> list[Finding]:
        # parameters an adversary steps are not the watched loss's to move (a discriminator's)
        theirs = self.adversaries.parameters
        history = self.gradients.param_history
        params = {n: r for n, r in history.items() if id(self._params.get(n)) not in theirs}
        layer_norms, layer_rms = rules.layer_gradients(params, self._sizes)
        return [
            *rules.exploding_gradient(
                layer_norms, self.gradients.history, th, self._output_shapes(), self.losses.entries
            ),
            *rules.vanishing_gradient(layer_rms, th),
            *rules.dead_units(self._unit_layers(), th, self.activations.flow.producers, self._pass_through),
            *rules.saturation(self.saturation.history, self.saturation.kinds, th),
            *rules.no_gradient(params, th),
            *rules.update_ratio(params, self._matrices, th),
            *rules.not_updated(params, self._param_groups(), th),
        ]

    def _output_shapes(self) -> rules.OutputShapes:
        """What ``exploding_gradient`` needs of the layers' output shapes (last recorded step)."""
        return rules.OutputShapes(self.gradients.output_widths(), self.gradients.shared_outputs())

    def _divergence(self, th: Thresholds) -> list[Finding]:
        """``loss_divergence`` from a scan per (window, factor) that reads every loss once, as it is read
        from the device (not the bounded history, which drops some)."""
        key = (th.loss_window, th.divergence_factor)
        scan = self._scans.get(key)
        if scan is None:  # a new scan starts from the kept history; record_losses feeds it from then on
            scan = self._scans[key] = rules.DivergenceScan(*key)
            scan.update(self.losses.entries)
        return scan.findings()

    def _stalled(self, th: Thresholds) -> list[Finding]:
        """``plateau`` / ``oscillating_loss``, run again once the run's losses grew by a 64th since the
        last run (at every check for the first 640 steps): its windows are an eighth of the run long, so
        this delays it by at most an eighth of a window. It reads the bounded loss history."""
        n = self.losses.total
        last = self._stall_memo
        if last is None or last[0] != th or n - last[1] >= max(1, last[1] // 64):
            self._stall_memo = last = (th, n, rules.stalled_loss(self.losses.entries, th))
        return last[2]

    def _unit_layers(self) -> dict[str, list[Any]]:
        """The activation histories of layers whose units can die: not a Flatten or other pure reshape,
        whose "units" are a channel's positions (a position that is 0 across a batch is no dead unit)."""
        history = self.activations.history
        return {name: records for name, records in history.items() if name not in self._reshapes}

    def _suspicious(self) -> bool:
        """A condition holds on the latest record that has not held for ``patience`` records yet (the
        record rules at patience 1 find something not reported), or the loss rose to half the
        divergence factor: the schedule then records every step until a check finds nothing new."""
        th = self.thresholds
        early = replace(th, patience=1, divergence_factor=max(1.0, th.divergence_factor / 2))
        found = [*self._record_rules(early), *self._divergence(early)]
        return any(self.log.is_new(f) for f in found)

    def _param_groups(self) -> dict[str, tuple[int, float]] | None:
        """Parameter name -> (index of its optimizer param group, that group's lr); None: no optimizer."""
        if self.optimizer is None:
            return None
        where = {
            id(p): (i, float(group.get("lr", 0.0)))
            for i, group in enumerate(self.optimizer.param_groups)
            for p in group["params"]
        }
        return {name: where[id(p)] for name, p in self._params.items() if id(p) in where}

    def add_findings(self, found: Iterable[Finding]) -> list[Finding]:
        """Keep (and print, unless quiet) the findings not kept before; returns them."""
        return self.log.add(found)

    def describe(self) -> str:
        """Every finding so far, one per line (or a line saying all is well)."""
        return self.log.describe()

    def report(self, found: Iterable[Finding]) -> list[Finding]:
        """Deprecated name of :meth:`add_findings`."""
        _renamed("Engine.report", "Engine.add_findings")
        return self.add_findings(found)

    def summary(self) -> str:
        """Deprecated name of :meth:`describe`."""
        _renamed("Engine.summary", "Engine.describe")
        return self.describe()

    # ---- checkpoint state ----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The finding log, every recorder's history (thinned), the bounded loss history, the validation
        phases' non-finite counts (pending device values read first), the epochs' losses, the schedule's
        alert and the steps since the last check: a resumed run repeats nothing, misses nothing and
        records the same steps."""
        self.read_pending()
        return {
            **self.log.state_dict(),
            "activations": self.activations.state_dict(),
            "gradients": self.gradients.state_dict(),
            "saturation": self.saturation.state_dict(),
            "protocol": self.protocol.state_dict(),
            "timing": self.timing.state_dict(),
            "losses": self.losses.state_dict(),
            "steps_since_check": self._steps_since_check,
            "valid_phases": [list(phase) for phase in self.valid_phases],
            "epoch_losses": torch.tensor(self.epoch_losses, dtype=torch.float64).reshape(-1, 4),
            "schedule": self.cadence.schedule.state_dict() if self.cadence.schedule is not None else {},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved; the next steps continue the checks and histories. An
        older Doctor checkpoint (whose recorders' state sat under other keys) restores all but those."""
        self.log.load_state_dict(state)
        for key, recorder in (("activations", self.activations), ("gradients", self.gradients)):
            if state.get(key):
                recorder.load_state_dict(state[key])
        if "protocol" in state:
            self.protocol.load_state_dict(state["protocol"])
        if "timing" in state:
            self.timing.load_state_dict(state["timing"])
        if "saturation" in state:
            self.saturation.load_state_dict(state["saturation"])
        else:
            self.saturation.load_state_dict({"history": state.get("saturation_history", {})})
        self.losses.load_state_dict(state["losses"] if "losses" in state else state["loss_history"])
        self._scans, self._stall_memo = {}, None
        self._steps_since_check = state["steps_since_check"]
        self.valid_phases = [tuple(phase) for phase in state.get("valid_phases", [])]
        rows = state.get("epoch_losses", torch.zeros(0, 4)).tolist()
        self.epoch_losses = [(int(e), int(s), t, v) for e, s, t, v in rows]
        if self.cadence.schedule is not None and state.get("schedule"):
            self.cadence.schedule.load_state_dict(state["schedule"])
        self._follow_thinnings()
        self._losses, self._pending_valid = [], []

    # ---- the engine's own statistics -----------------------------------------------------------------

    def _read_own(self) -> None:
        """Turn the device-side losses, saturation shares, validation counts and the protocol's rows
        (input fingerprints, labels: this rank's own, not combined over ranks) into host numbers in one
        transfer."""
        losses, self._losses = self._losses, []
        shares = self.saturation.take_pending()
        valid, self._pending_valid = self._pending_valid, []
        rows = self.protocol.pending()
        tensors = [torch.stack([v for _, v in losses])] if losses else []
        tensors += [v for _, _, v in shares] + [bad for _, _, bad in valid]
        if not tensors and not rows:
            return
        combined = _over_ranks(tensors, averaged=len(tensors) - len(valid)) if tensors else []
        host = to_host(combined + rows)
        if rows:
            self.protocol.store(host[len(host) - len(rows) :])
            del host[len(host) - len(rows) :]
        if losses:
            values = host.pop(0)
            self.record_losses([(step, float(v)) for (step, _), v in zip(losses, values, strict=True)])
        self.saturation.store(shares, host[: len(shares)])
        for (step, batches, _), bad in zip(valid, host[len(shares) :], strict=True):
            self.valid_phases.append((step, batches, int(bad)))
        del self.valid_phases[:-PER_EPOCH_RECORDS]


def _over_ranks(tensors: list[torch.Tensor], averaged: int) -> list[torch.Tensor]:
    """Under torchrun, the engine's own numbers of every rank combined (one all-reduce, in the lockstep
    of a check): the first ``averaged`` (losses, saturation shares) averaged over ranks, the rest
    (non-finite counts) added, so the rules see the same numbers, and report the same, on every rank."""
    if not several_ranks():
        return tensors
    flat = torch.cat([t.detach().reshape(-1).to(torch.float64) for t in tensors])
    torch.distributed.all_reduce(flat)
    sizes = [t.numel() for t in tensors]
    world = torch.distributed.get_world_size()
    scale = [1 / world if i < averaged else 1.0 for i in range(len(tensors))]
    parts = flat.split(sizes)
    return [(part * k).view(t.shape) for part, k, t in zip(parts, scale, tensors, strict=True)]


def _renamed(old: str, new: str) -> None:
    warnings.warn(
        f"{old} is now {new}; the old name goes in the next release", DeprecationWarning, stacklevel=3
    )
