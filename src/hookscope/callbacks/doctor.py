"""The Doctor: watches a training run and says, in plain words, what is wrong and where.

It is made of three callbacks — :class:`ActivationStats` and :class:`GradientStats` (the on-device
statistics) and a :class:`NonFiniteGuard` — which it declares as its ``parts``: the Learner dispatches
them as callbacks of their own, each at its own ``order``, and runs the Doctor after them at every
event. The Doctor itself adds a small hook on tanh/sigmoid layers for saturation. Every
``check_every`` training steps (and once at the end) it reads everything pending in a few bulk
transfers and applies the rules of :mod:`hookscope.callbacks.doctor_rules`. New findings are printed
once, deduplicated by (kind, module), and kept in ``learn.doctor.findings``.

``hs.diagnose(model_or_learner, data, steps=...)`` runs a short training on a copy of the model with a
Doctor attached, as a quick check before a long run.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from hookscope.callbacks import doctor_rules as rules
from hookscope.callbacks.guard import NonFiniteGuard
from hookscope.callbacks.monitor import ActivationStats, GradientStats, ParamRecord
from hookscope.doctor.findings import Finding, Thresholds
from hookscope.hooks.handles import HookSet
from hookscope.hooks.select import Spec
from hookscope.hooks.stats import to_host
from hookscope.train.callback import Callback
from hookscope.train.data import DataLoaders, require_batches
from hookscope.train.events import CancelFitException
from hookscope.train.learner import Learner

_SATURATING = {nn.Tanh: "tanh", nn.Sigmoid: "sigmoid", nn.Hardtanh: "tanh", nn.Softsign: "tanh"}
# Whole-model conditions: the first finding says where it starts; later ones would repeat it.
_ONCE_PER_RUN = frozenset(
    {"exploding_gradient", "vanishing_gradient", "loss_divergence", "nonfinite", "nonfinite_validation"}
)
_SEVERITY_STYLE = {"info": "cyan", "warning": "yellow", "error": "bold red"}


class Doctor(Callback):
    """Diagnoses a run: dead units, saturation, exploding/vanishing gradients, missing gradients,
    frozen parameters, update ratios, loss divergence and NaN/Inf (with the blamed module and op).

    ``select`` picks the layers watched (None: every leaf module); statistics are taken every ``every``
    training steps and the rules run every ``check_every`` steps. The statistics are the main cost
    (about 1.4x a tiny CNN's step at ``every=1``; see docs/benchmarks.md): raise ``every`` for long runs.
    ``guard=False`` leaves NaN/Inf alone (by default the fit stops at the first one, keeping the last
    good weights).
    ``quiet=True`` only collects findings; ``max_print`` caps how many are printed per fit.
    """

    order = 15
    run_after = ("MixedPrecision",)

    def __init__(
        self,
        select: Spec = None,
        every: int = 1,
        check_every: int = 10,
        thresholds: Thresholds | None = None,
        guard: bool = True,
        quiet: bool = False,
        max_print: int = 10,
    ) -> None:
        if every < 1 or check_every < 1:
            raise ValueError(f"Doctor: every={every}, check_every={check_every}; both must be >= 1")
        self.thresholds = thresholds or Thresholds()
        self.check_every, self.quiet, self.max_print = check_every, quiet, max_print
        # include_valid: one record per validation phase, whose non-finite counts name the layer that
        # first made a NaN/Inf on the validation data (read in the bulk transfers of check()).
        self.activations = ActivationStats(
            select=select, every=every, include_valid=True, read_every=check_every
        )
        self.gradients = GradientStats(every=every, select=select, output_grads=True, read_every=check_every)
        self.guard = NonFiniteGuard(quiet=True) if guard else None
        self.findings: list[Finding] = []
        self._seen: set[tuple[str, str]] = set()
        self._printed = 0
        self._hooks = HookSet()
        self._saturation: dict[str, list[torch.Tensor]] = {}
        self._pending_saturation: list[tuple[str, int, torch.Tensor]] = []
        self._saturation_history: dict[str, list[tuple[int, float]]] = {}
        self._kinds: dict[str, str] = {}
        self._losses: list[tuple[int, torch.Tensor]] = []
        self._loss_history: list[tuple[int, float]] = []
        self._valid_losses: list[torch.Tensor] = []
        self._pending_valid: list[tuple[int, int, torch.Tensor]] = []
        self._valid_phases: list[tuple[int, int, int]] = []
        self._steps_since_check = 0

    @property
    def parts(self) -> list[Callback]:
        """The callbacks the Doctor is made of; the Learner runs them, and the Doctor after them."""
        return [cb for cb in (self.guard, self.activations, self.gradients) if cb is not None]

    # ---- events ----------------------------------------------------------------------------------------

    def before_fit(self) -> None:
        self._watch_saturation()
        model = self.learn.model
        frozen: dict[str, int] = {}
        for name, p in model.named_parameters():
            if not p.requires_grad:
                module = name.rpartition(".")[0]
                frozen[module] = frozen.get(module, 0) + p.numel()
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        self._report(rules.frozen(frozen, trainable))

    def after_loss(self) -> None:
        if self.learn.training:
            self._losses.append((self.learn.training_step, self.learn.loss.detach().float()))
        else:
            self._valid_losses.append(self.learn.loss)

    def before_validate(self) -> None:
        self._valid_losses = []

    def after_validate(self) -> None:
        """Count the phase's non-finite batch losses on the device; :meth:`check` reads the count."""
        losses, self._valid_losses = self._valid_losses, []
        if losses:
            bad = torch.stack([loss.float().sum() for loss in losses]).isfinite().logical_not().sum()
            self._pending_valid.append((self.learn.training_step, len(losses), bad))

    def after_batch(self) -> None:
        if not self.learn.training:
            return
        self._close_step()
        self._steps_since_check += 1
        if self._steps_since_check >= self.check_every:
            self.check()

    def after_cancel_fit(self) -> None:
        if self.guard is not None and self.guard.report is not None:
            self._report(rules.nonfinite(self.guard.report, self.guard.stopped_at or 0, self.guard.reason))

    def after_fit(self) -> None:
        self._hooks.remove()
        self.check()

    def on_failure(self, exc: BaseException) -> None:
        self._hooks.remove()

    # ---- checkpoint state ------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Findings, what was already reported and printed, the loss and saturation histories, the
        validation phases' non-finite counts (pending device values read first) and the steps since the
        last check: a resumed run repeats nothing and misses nothing."""
        self._read_own()
        return {
            "findings": [_plain(f.to_dict()) for f in self.findings],
            "seen": [list(key) for key in sorted(self._seen)],
            "printed": self._printed,
            "loss_history": _series_state(self._loss_history),
            "saturation_history": {name: _series_state(h) for name, h in self._saturation_history.items()},
            "steps_since_check": self._steps_since_check,
            "valid_phases": [list(phase) for phase in self._valid_phases],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved; the next ``fit`` continues the checks and histories."""
        self.findings = [Finding(**f) for f in state["findings"]]
        self._seen = {(kind, module) for kind, module in state["seen"]}
        self._printed = state["printed"]
        self._loss_history = _series_from_state(state["loss_history"])
        self._saturation_history = {n: _series_from_state(h) for n, h in state["saturation_history"].items()}
        self._steps_since_check = state["steps_since_check"]
        self._valid_phases = [tuple(phase) for phase in state.get("valid_phases", [])]
        self._losses, self._pending_saturation, self._pending_valid = [], [], []

    # ---- checking --------------------------------------------------------------------------------------

    def check(self) -> list[Finding]:
        """Read what is pending, run every rule, print and keep the new findings; returns them."""
        self._steps_since_check = 0
        self._read_own()
        th = self.thresholds
        params = self.gradients.param_history
        layer_norms, layer_rms = _layer_gradients(params, self._sizes())
        matrices = {name for name, p in self.learn.model.named_parameters() if p.dim() >= 2}
        found = [
            *rules.loss_divergence(self._loss_history, th),
            *rules.exploding_gradient(layer_norms, self.gradients.history, th),
            *rules.vanishing_gradient(layer_rms, th),
            *rules.dead_units(self.activations.history, th),
            *rules.saturation(self._saturation_history, self._kinds, th),
            *rules.no_gradient(params, th),
            *rules.update_ratio(params, matrices, th),
            *rules.nonfinite_validation(self._valid_phases, self.activations.valid_history),
        ]
        return self._report(found)

    def summary(self) -> str:
        """Every finding so far, one per line (or a line saying all is well)."""
        if not self.findings:
            return "Doctor: no finding — activations, gradients, updates and the loss look healthy."
        return "\n".join(str(f) for f in self.findings)

    def _report(self, found: Iterable[Finding]) -> list[Finding]:
        new = []
        for finding in found:
            key = (finding.kind, "" if finding.kind in _ONCE_PER_RUN else finding.module)
            if key in self._seen:
                continue
            self._seen.add(key)
            new.append(finding)
        for finding in new:
            self.findings.append(finding)
            if not self.quiet and self._printed < self.max_print:
                self._printed += 1
                _print_finding(finding)
        return new

    def _watch_saturation(self) -> None:
        self._hooks.remove()
        margin = self.thresholds.saturation_margin
        for name, module in self.learn.model.named_modules():
            kind = next((k for t, k in _SATURATING.items() if isinstance(module, t)), None)
            if kind is None:
                continue
            self._kinds[name] = kind
            self._saturation.setdefault(name, [])
            self._saturation_history.setdefault(name, [])
            self._hooks.forward(module, self._saturation_hook(name, kind, margin))

    def _saturation_hook(self, name: str, kind: str, margin: float) -> Callable:
        low, high = (-1.0 + margin, 1.0 - margin) if kind == "tanh" else (margin, 1.0 - margin)

        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if self.learn.training and isinstance(output, torch.Tensor):
                out = output.detach()
                self._saturation[name].append(((out <= low) | (out >= high)).float().mean())

        return hook

    def _close_step(self) -> None:
        """Fold this batch's saturation shares into one device scalar per layer, keyed by the step."""
        step = self.learn.training_step
        for name, values in self._saturation.items():
            if values:
                self._pending_saturation.append((name, step, torch.stack(values).mean()))
                self._saturation[name] = []

    def _read_own(self) -> None:
        """Turn the device-side losses and saturation shares into host numbers in one transfer."""
        losses, self._losses = self._losses, []
        shares, self._pending_saturation = self._pending_saturation, []
        valid, self._pending_valid = self._pending_valid, []
        tensors = [torch.stack([v for _, v in losses])] if losses else []
        tensors += [v for _, _, v in shares] + [bad for _, _, bad in valid]
        if not tensors:
            return
        host = to_host(tensors)
        if losses:
            self._loss_history += [(step, float(v)) for (step, _), v in zip(losses, host.pop(0), strict=True)]
        for (name, step, _), share in zip(shares, host[: len(shares)], strict=True):
            self._saturation_history[name].append((step, float(share)))
        for (step, batches, _), bad in zip(valid, host[len(shares) :], strict=True):
            self._valid_phases.append((step, batches, int(bad)))

    def _sizes(self) -> dict[str, int]:
        return {name: p.numel() for name, p in self.learn.model.named_parameters()}


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


def _print_finding(finding: Finding) -> None:
    """One finding on stderr, coloured by severity."""
    from rich.console import Console  # loaded on the first finding, not with hookscope

    style = _SEVERITY_STYLE.get(finding.severity, "")
    console = Console(stderr=True, highlight=False, soft_wrap=True)  # one finding, one line, in any log
    console.print(f"Doctor {finding}", style=style, markup=False)


def _layer_gradients(
    params: dict[str, list[ParamRecord]], sizes: dict[str, int]
) -> tuple[dict[str, list[tuple[int, float]]], dict[str, list[tuple[int, float]]]]:
    """Per module (model order): ``(step, gradient L2 norm)`` and ``(step, gradient RMS per value)``."""
    squares: dict[str, dict[int, float]] = {}
    counts: dict[str, int] = {}
    for name, records in params.items():
        module = name.rpartition(".")[0]
        counts[module] = counts.get(module, 0) + sizes.get(name, 1)
        per_step = squares.setdefault(module, {})
        for r in records:
            if r.grad_norm is not None:
                per_step[r.step] = per_step.get(r.step, 0.0) + r.grad_norm**2
    norms = {
        m: [(s, math.sqrt(v)) for s, v in sorted(steps.items())] for m, steps in squares.items() if steps
    }
    rms = {m: [(s, n / math.sqrt(counts[m])) for s, n in records] for m, records in norms.items()}
    return norms, rms


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
    ``label_problem`` finding.
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
    doctor = Doctor(quiet=quiet, check_every=max(1, min(10, steps)), **doctor_kw)
    loader = _train_loader(data)
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
    doctor._report(targets.findings())
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


def _train_loader(data: Any) -> Any:
    if isinstance(data, DataLoaders):
        return data.train
    if isinstance(data, tuple | list) and len(data) == 2 and all(isinstance(d, torch.Tensor) for d in data):
        return [tuple(data)]
    if isinstance(data, tuple | list) and len(data) == 2 and hasattr(data[0], "__iter__"):
        return data[0]
    if hasattr(data, "__iter__") and hasattr(data, "__len__"):
        return data
    raise TypeError(
        f"diagnose: data of type {type(data).__name__} is not a DataLoader, a (train, valid) pair or an "
        "(inputs, targets) batch; pass one of these"
    )
