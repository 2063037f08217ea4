"""The doctor's engine: which statistics to keep, when to read them, the rules, the findings.

One engine serves every loop. It is fed by explicit calls — :meth:`Engine.begin_batch` (training or not,
which step), :meth:`~Engine.log_loss`, :meth:`~Engine.gradients_ready` (gradients are final: unscaled,
not yet clipped), :meth:`~Engine.step_done` (the optimizer stepped), :meth:`~Engine.end_batch` (the step
ends), :meth:`~Engine.begin_valid` / :meth:`~Engine.end_valid`, :meth:`~Engine.close` — and the Learner's
``Doctor`` and ``hs.watch`` are adapters that make those calls from their loop's events.

The engine owns an :class:`~hookscope.doctor.records.ActivationRecorder` and a
:class:`~hookscope.doctor.records.GradientRecorder`, and itself watches tanh/sigmoid layers (saturation),
the loss and the validation phases. With ``drive_recorders=True`` (``hs.watch``) the feed calls reach the
recorders too; the Learner's Doctor passes False, because there the recorders are driven by the
``ActivationStats`` / ``GradientStats`` callbacks of its ``parts``, each at its own place among clipping
and mixed precision.

Every ``check_every`` training steps (and at :meth:`~Engine.close`), :meth:`~Engine.check` reads
everything pending to the host (:meth:`~Engine.read_pending`, the one place where device statistics
become host numbers) and runs the rules of :mod:`hookscope.doctor.rules` (:meth:`~Engine.diagnose`, the
one place where rules run). New findings are printed once, deduplicated by (kind, module) — whole-model
kinds once per run — and kept in ``findings``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from hookscope.doctor import rules
from hookscope.doctor.findings import Finding, Thresholds
from hookscope.doctor.records import (
    RESHAPES,
    ActivationRecorder,
    GradientRecorder,
    TrainingOf,
    computing_leaves,
    on_schedule,
)
from hookscope.doctor.schedule import Schedule
from hookscope.hooks.handles import SwitchedHooks
from hookscope.hooks.nonfinite import NonFiniteReport
from hookscope.hooks.select import Spec
from hookscope.hooks.stats import several_ranks, to_host

_SATURATING = {nn.Tanh: "tanh", nn.Sigmoid: "sigmoid", nn.Hardtanh: "tanh", nn.Softsign: "tanh"}
# Whole-model conditions: the first finding says where it starts; later ones would repeat it.
ONCE_PER_RUN = frozenset(
    {
        "exploding_gradient",
        "vanishing_gradient",
        "loss_divergence",
        "nonfinite",
        "nonfinite_validation",
        "oscillating_loss",
        "plateau",
        "overfitting",
    }
)
_SEVERITY_STYLE = {"info": "cyan", "warning": "yellow", "error": "bold red"}


class Engine:
    """The doctor, loop-independent: statistics, rules, findings, deduplication and printing.

    ``select`` picks the layers watched (None: every leaf module but pure reshapes, see
    :func:`~hookscope.doctor.records.computing_leaves`); statistics are taken every ``every``
    training steps — ``every=None``: on the adaptive :class:`~hookscope.doctor.schedule.Schedule` (every
    step at first, then sparsely, densely again while a check is suspicious) — and the rules run every
    ``check_every`` steps; the loss is kept at every step. ``quiet=True`` only collects findings;
    ``max_print`` caps how many are printed. ``diagnose=False`` records without running the rules.
    ``training_of``: None when the loop says whether a batch trains (:meth:`begin_batch`); a function of
    the module when it cannot (``hs.watch`` asks each forward). ``owner`` names the caller in errors.
    """

    def __init__(
        self,
        select: Spec = None,
        every: int | None = 1,
        check_every: int = 10,
        thresholds: Thresholds | None = None,
        quiet: bool = False,
        max_print: int = 10,
        diagnose: bool = True,
        drive_recorders: bool = True,
        training_of: TrainingOf = None,
        owner: str = "Doctor",
    ) -> None:
        if (every is not None and every < 1) or check_every < 1:
            raise ValueError(
                f"{owner}: every={every}, check_every={check_every}; use every >= 1 (or None: the "
                "adaptive schedule) and check_every >= 1"
            )
        self.schedule = Schedule() if every is None else None
        select = computing_leaves if select is None else select
        every = every or 1
        self.thresholds = thresholds or Thresholds()
        self.check_every, self.quiet, self.max_print = check_every, quiet, max_print
        self.diagnose_enabled, self.drive_recorders = diagnose, drive_recorders
        # include_valid: one record per validation phase, whose non-finite counts name the layer that
        # first made a NaN/Inf on the validation data (read in the bulk transfers of check()).
        self.activations = ActivationRecorder(
            select=select, every=every, include_valid=True, read_every=check_every, owner=owner
        )
        self.gradients = GradientRecorder(
            every=every, select=select, output_grads=True, read_every=check_every, owner=owner
        )
        self.training_of = self.activations.training_of = self.gradients.training_of = training_of
        self.activations.schedule = self.gradients.schedule = self.schedule
        self.findings: list[Finding] = []
        # called with the new findings at the end of every check: an adapter logs or acts then
        self.after_check: list[Callable[[list[Finding]], None]] = []
        self.loss_history: list[tuple[int, float]] = []
        self.saturation_history: dict[str, list[tuple[int, float]]] = {}
        self.valid_phases: list[tuple[int, int, int]] = []
        self.epoch_losses: list[tuple[int, int, float, float]] = []
        self.optimizer: torch.optim.Optimizer | None = None
        self._params: dict[str, nn.Parameter] = {}
        self._recording_step = True  # saturation follows the schedule
        self._seen: set[tuple[str, str]] = set()
        self._printed = 0
        self._hooks = SwitchedHooks()  # saturation: on only during recorded training steps (switched
        # when a step starts, so consecutive recorded steps keep them)
        self._training = self._in_valid = False
        self._step = 0
        self._saturation: dict[str, list[torch.Tensor]] = {}
        self._pending_saturation: list[tuple[str, int, torch.Tensor]] = []
        self._kinds: dict[str, str] = {}
        self._losses: list[tuple[int, torch.Tensor]] = []
        self._valid_losses: list[torch.Tensor] = []
        self._pending_valid: list[tuple[int, int, torch.Tensor]] = []
        self._steps_since_check = 0
        self._sizes: dict[str, int] = {}
        self._matrices: set[str] = set()
        self._reshapes: set[str] = set()
        # The record rules' findings per Thresholds, valid while the histories they read stay unchanged.
        self._rules_memo: dict[Thresholds, list[Finding]] = {}
        self._rules_basis: tuple[int, ...] = ()
        self._saturation_version = 0
        # The loss rules' state: a divergence scan per (window, factor); the stall rule's last result.
        self._scans: dict[tuple[int, float], rules.DivergenceScan] = {}
        self._stall_memo: tuple[Thresholds, int, list[Finding]] | None = None

    @property
    def _recorders(self) -> list[ActivationRecorder | GradientRecorder]:
        """The recorders the feed calls reach (none when the loop drives them itself)."""
        return [self.activations, self.gradients] if self.drive_recorders else []

    # ---- feed ----------------------------------------------------------------------------------------

    def attach(self, model: nn.Module) -> None:
        """Hook ``model`` (recorders when driven, saturation always) and report frozen parameters."""
        for recorder in self._recorders:
            recorder.attach(model)
        self._training = False
        self._watch_saturation(model)
        self._sizes = {name: p.numel() for name, p in model.named_parameters()}
        self._params = dict(model.named_parameters())
        self._matrices = {name for name, p in model.named_parameters() if p.dim() >= 2}
        self._reshapes = {name for name, m in model.named_modules() if isinstance(m, RESHAPES)}
        self._rules_basis = ()  # sizes and layer kinds are the new model's: the record rules run again
        frozen: dict[str, int] = {}
        for name, p in model.named_parameters():
            if not p.requires_grad:
                module = name.rpartition(".")[0]
                frozen[module] = frozen.get(module, 0) + p.numel()
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        if self.diagnose_enabled:
            self.report(rules.frozen(frozen, trainable))

    def begin_batch(self, step: int, training: bool) -> None:
        """A batch starts: a training batch of optimizer step ``step``, or (``training=False``) another."""
        for recorder in self._recorders:
            recorder.begin_batch(step, training)
        self._training = training
        if training:
            self._step = step
            self._recording_step = on_schedule(step, 1, self.schedule)
            self._hooks.switch(self._recording_step)

    def log_loss(self, loss: torch.Tensor, training: bool) -> None:
        """The batch's loss (a device tensor; no host sync): the loss rules read the training ones, the
        validation phase counts non-finite ones."""
        if training:
            self._losses.append((self._step, loss.detach().float()))
        elif self._in_valid:
            self._valid_losses.append(loss.detach())

    def gradients_ready(self) -> None:
        """The gradients of this optimizer step are final (unscaled, before clipping)."""
        if self.drive_recorders:
            self.gradients.gradients_ready()

    def step_done(self) -> None:
        """The optimizer stepped (update ratios are measured around it)."""
        if self.drive_recorders:
            self.gradients.step_done()

    def step_cancelled(self) -> None:
        """The step was cancelled after :meth:`gradients_ready`: the norms stay, without a ratio."""
        if self.drive_recorders:
            self.gradients.step_cancelled()

    def discard_batch(self) -> None:
        """The step did not happen (a grad scaler skipped it): forget its statistics windows."""
        for recorder in self._recorders:
            recorder.discard_batch()
        for name in self._saturation:
            self._saturation[name] = []

    def end_batch(self) -> None:
        """The training step ends: close its windows; every ``check_every`` steps run :meth:`check`."""
        for recorder in self._recorders:
            recorder.end_batch()
        self._close_step()
        self._steps_since_check += 1
        if self._steps_since_check >= self.check_every:
            self.check()

    def begin_valid(self) -> None:
        if self.drive_recorders:
            self.activations.begin_valid()
        self._valid_losses, self._in_valid, self._training = [], True, False

    def end_valid(self, step: int) -> None:
        """Count the phase's non-finite batch losses on the device; :meth:`check` reads the count."""
        if self.drive_recorders:
            self.activations.end_valid(step)
        losses, self._valid_losses, self._in_valid = self._valid_losses, [], False
        if losses:
            bad = torch.stack([loss.float().sum() for loss in losses]).isfinite().logical_not().sum()
            self._pending_valid.append((step, len(losses), bad))

    def log_epoch(self, epoch: int, step: int, train_loss: float, valid_loss: float) -> None:
        """An epoch ended at training step ``step`` with these mean losses (host numbers the loop already
        read): the ``overfitting`` rule compares them across epochs at the next check."""
        self.epoch_losses.append((epoch, step, float(train_loss), float(valid_loss)))

    def watch_optimizer(self, optimizer: torch.optim.Optimizer | None) -> None:
        """The optimizer stepping the model: ``not_updated`` then says whether a parameter that never
        changes is missing from it or sits in a group with learning rate 0."""
        self.optimizer = optimizer

    def report_nonfinite(self, report: NonFiniteReport, step: int, reason: str | None) -> list[Finding]:
        """The guard stopped at ``step``: its blame becomes a finding."""
        return self.report(rules.nonfinite(report, step, reason))

    def close(self) -> list[Finding]:
        """Remove every hook, read what is pending and run the rules a last time; returns new findings."""
        self._hooks.clear()
        for recorder in self._recorders:
            recorder.close()
        self._stall_memo = None  # the last check sees the whole history
        return self.check()

    def fail(self) -> None:
        """Remove every hook after an error; the open windows are dropped."""
        self._hooks.clear()
        for recorder in self._recorders:
            recorder.fail()

    # ---- checking ------------------------------------------------------------------------------------

    def check(self) -> list[Finding]:
        """Read what is pending, run every rule, print and keep the new findings, hand them to each
        ``after_check`` listener; returns them."""
        self._steps_since_check = 0
        self.read_pending()
        new: list[Finding] = []
        if self.diagnose_enabled:
            new = self.report(self.diagnose())
            if self.schedule is not None and self._suspicious():
                self.schedule.tighten(self._step + 1 + self.check_every)
        for listener in self.after_check:
            listener(new)
        return new

    def read_pending(self) -> None:
        """Every pending device statistic to the host: the recorders' and the engine's own."""
        self.activations.flush()
        self.gradients.flush()
        self._read_own()

    def diagnose(self) -> list[Finding]:
        """Every rule on the host histories (read them first: :meth:`read_pending`)."""
        th = self.thresholds
        return [
            *self._divergence(th),
            *self._stalled(th),
            *rules.overfitting(self.epoch_losses, th),
            *self._record_rules(th),
            *rules.nonfinite_validation(self.valid_phases, self.activations.valid_history),
        ]

    def _record_rules(self, th: Thresholds) -> list[Finding]:
        """The rules on the recorded statistics (those the schedule samples), run again only when the
        histories changed since they last ran at ``th``: between two sparse records (most checks of the
        default schedule) they would find the same."""
        basis = (
            self.activations.version,
            self.gradients.version,
            self._saturation_version,
            id(self.optimizer),
        )
        if basis != self._rules_basis:
            self._rules_basis, self._rules_memo = basis, {}
        if th not in self._rules_memo:
            self._rules_memo[th] = self._run_record_rules(th)
        return self._rules_memo[th]

    def _run_record_rules(self, th: Thresholds) -> list[Finding]:
        params = self.gradients.param_history
        layer_norms, layer_rms = rules.layer_gradients(params, self._sizes)
        return [
            *rules.exploding_gradient(layer_norms, self.gradients.history, th),
            *rules.vanishing_gradient(layer_rms, th),
            *rules.dead_units(self._unit_layers(), th),
            *rules.saturation(self.saturation_history, self._kinds, th),
            *rules.no_gradient(params, th),
            *rules.update_ratio(params, self._matrices, th),
            *rules.not_updated(params, self._param_groups(), th),
        ]

    def _divergence(self, th: Thresholds) -> list[Finding]:
        """``loss_divergence`` from a scan per (window, factor) that reads only the new losses."""
        key = (th.loss_window, th.divergence_factor)
        scan = self._scans.setdefault(key, rules.DivergenceScan(*key))
        scan.update(self.loss_history)
        return scan.findings()

    def _stalled(self, th: Thresholds) -> list[Finding]:
        """``plateau`` / ``oscillating_loss``, run again once the loss history grew by a 64th since the
        last run (at every check for the first 640 steps): its windows are an eighth of the run long, so
        this delays it by at most an eighth of a window, and a check's cost no longer grows with the run."""
        n = len(self.loss_history)
        last = self._stall_memo
        if last is None or last[0] != th or n - last[1] >= max(1, last[1] // 64):
            self._stall_memo = last = (th, n, rules.stalled_loss(self.loss_history, th))
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
        return any(self._key(f) not in self._seen for f in found)

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

    def report(self, found: Iterable[Finding]) -> list[Finding]:
        """Keep (and print, unless quiet) the findings not reported before; returns them."""
        new = []
        for finding in found:
            key = self._key(finding)
            if key in self._seen:
                continue
            self._seen.add(key)
            new.append(finding)
        for finding in new:
            self.findings.append(finding)
            if not self.quiet and self._printed < self.max_print:
                self._printed += 1
                print_finding(finding)
        return new

    @staticmethod
    def _key(finding: Finding) -> tuple[str, str]:
        """What deduplicates findings: the kind, and the module unless the kind is whole-model."""
        return (finding.kind, "" if finding.kind in ONCE_PER_RUN else finding.module)

    def summary(self) -> str:
        """Every finding so far, one per line (or a line saying all is well)."""
        if not self.findings:
            return "Doctor: no finding — activations, gradients, updates and the loss look healthy."
        return "\n".join(str(f) for f in self.findings)

    # ---- checkpoint state ----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Findings, what was already reported and printed, the loss and saturation histories, the
        validation phases' non-finite counts (pending device values read first), the epochs' losses, the
        schedule's alert and the steps since the last check: a resumed run repeats nothing, misses
        nothing and records the same steps. The recorders keep their own."""
        self._read_own()
        return {
            "findings": [_plain(f.to_dict()) for f in self.findings],
            "seen": [list(key) for key in sorted(self._seen)],
            "printed": self._printed,
            "loss_history": _series_state(self.loss_history),
            "saturation_history": {name: _series_state(h) for name, h in self.saturation_history.items()},
            "steps_since_check": self._steps_since_check,
            "valid_phases": [list(phase) for phase in self.valid_phases],
            "epoch_losses": torch.tensor(self.epoch_losses, dtype=torch.float64).reshape(-1, 4),
            "schedule": self.schedule.state_dict() if self.schedule is not None else {},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved; the next steps continue the checks and histories."""
        self.findings = [Finding(**f) for f in state["findings"]]
        self._seen = {(kind, module) for kind, module in state["seen"]}
        self._printed = state["printed"]
        self.loss_history = _series_from_state(state["loss_history"])
        self._scans, self._stall_memo = {}, None
        self.saturation_history = {n: _series_from_state(h) for n, h in state["saturation_history"].items()}
        self._saturation_version += 1
        self._steps_since_check = state["steps_since_check"]
        self.valid_phases = [tuple(phase) for phase in state.get("valid_phases", [])]
        rows = state.get("epoch_losses", torch.zeros(0, 4)).tolist()
        self.epoch_losses = [(int(e), int(s), t, v) for e, s, t, v in rows]
        if self.schedule is not None and state.get("schedule"):
            self.schedule.load_state_dict(state["schedule"])
        self._losses, self._pending_saturation, self._pending_valid = [], [], []

    # ---- the engine's own statistics -----------------------------------------------------------------

    def _watch_saturation(self, model: nn.Module) -> None:
        margin = self.thresholds.saturation_margin
        hooks = []
        for name, module in model.named_modules():
            kind = next((k for t, k in _SATURATING.items() if isinstance(module, t)), None)
            if kind is None:
                continue
            self._kinds[name] = kind
            self._saturation.setdefault(name, [])
            self.saturation_history.setdefault(name, [])
            hooks.append((module, self._saturation_hook(name, kind, margin)))
        self._hooks.targets(hooks)
        self._hooks.switch(self._recording_step)

    def _saturation_hook(self, name: str, kind: str, margin: float) -> Callable:
        low, high = (-1.0 + margin, 1.0 - margin) if kind == "tanh" else (margin, 1.0 - margin)

        def hook(module: nn.Module, args: Any, output: Any) -> None:
            training = self._training if self.training_of is None else self.training_of(module)
            if training and self._recording_step and isinstance(output, torch.Tensor):
                out = output.detach()
                self._saturation[name].append(((out <= low) | (out >= high)).float().mean())

        return hook

    def _close_step(self) -> None:
        """Fold this step's saturation shares into one device scalar per layer, keyed by the step."""
        for name, values in self._saturation.items():
            if values:
                self._pending_saturation.append((name, self._step, torch.stack(values).mean()))
                self._saturation[name] = []

    def _read_own(self) -> None:
        """Turn the device-side losses, saturation shares and validation counts into host numbers in one
        transfer."""
        losses, self._losses = self._losses, []
        shares, self._pending_saturation = self._pending_saturation, []
        valid, self._pending_valid = self._pending_valid, []
        tensors = [torch.stack([v for _, v in losses])] if losses else []
        tensors += [v for _, _, v in shares] + [bad for _, _, bad in valid]
        if not tensors:
            return
        host = to_host(_over_ranks(tensors, averaged=len(tensors) - len(valid)))
        if losses:
            self.loss_history += [(step, float(v)) for (step, _), v in zip(losses, host.pop(0), strict=True)]
        for (name, step, _), share in zip(shares, host[: len(shares)], strict=True):
            self.saturation_history[name].append((step, float(share)))
        if shares:
            self._saturation_version += 1
        for (step, batches, _), bad in zip(valid, host[len(shares) :], strict=True):
            self.valid_phases.append((step, batches, int(bad)))


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


def print_finding(finding: Finding) -> None:
    """One finding on stderr, on one line, coloured by severity."""
    from rich.console import Console  # loaded on the first finding, not with hookscope

    style = _SEVERITY_STYLE.get(finding.severity, "")
    console = Console(stderr=True, highlight=False, soft_wrap=True)  # one finding, one line, in any log
    console.print(f"Doctor {finding}", style=style, markup=False)


def _plain(value: Any) -> Any:
    """``value`` with numpy numbers and arrays (rules put them in evidence) as Python numbers and lists,
    which a checkpoint can hold."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return _plain(value.tolist()) if hasattr(value, "tolist") else value


def _series_state(series: list[tuple[int, float]]) -> dict[str, torch.Tensor]:
    """``(step, value)`` pairs as two tensors: a checkpoint checks and checksums every plain number."""
    return {
        "step": torch.tensor([step for step, _ in series], dtype=torch.int64),
        "value": torch.tensor([value for _, value in series], dtype=torch.float64),
    }


def _series_from_state(state: dict[str, torch.Tensor]) -> list[tuple[int, float]]:
    return list(zip(state["step"].tolist(), state["value"].tolist(), strict=True))
