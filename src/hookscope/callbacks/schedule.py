"""Hyper-parameter schedules: fastai-style ``ParamScheduler``, one-cycle, cosine, and any torch scheduler.

A schedule is a plain function of ``pct_train`` (the fraction of training done, 0 at the first batch)
returning a value: an :data:`Annealer` (fastai's ``sched_*`` functions). ``ParamScheduler`` writes
the values into ``learn.opt.param_groups`` in ``before_batch``, so the optimizer step of that batch uses
them and the Recorder sees them. The name ``"momentum"`` means SGD's ``momentum`` or, for Adam-style
optimizers, the first of ``betas`` — the same rule as ``torch.optim.lr_scheduler.OneCycleLR``.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import torch

from hookscope._deprecation import deprecated
from hookscope.train.callback import Callback

# A value as a function of pct_train. Formerly ``Schedule``, a name the doctor's RecordingSchedule and
# torch's schedulers also claimed; the old name warns for a release.
Annealer = Callable[[float], float]


def sched_lin(start: float, end: float) -> Annealer:
    """Straight line from ``start`` (pct 0) to ``end`` (pct 1)."""
    return lambda pct: start + (end - start) * pct


def sched_cos(start: float, end: float) -> Annealer:
    """Half a cosine from ``start`` to ``end``: flat at both ends, steepest in the middle."""
    return lambda pct: end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1.0)


def sched_exp(start: float, end: float) -> Annealer:
    """Geometric from ``start`` to ``end`` (both > 0): equal ratios per step, as an LR sweep needs."""
    return lambda pct: start * (end / start) ** pct


def sched_const(value: float) -> Annealer:
    """Always ``value``."""
    return lambda pct: value


def combine_scheds(pcts: Sequence[float], scheds: Sequence[Annealer]) -> Annealer:
    """Run ``scheds[i]`` over a fraction ``pcts[i]`` of training, each seeing its own 0..1 progress."""
    if len(pcts) != len(scheds) or not math.isclose(sum(pcts), 1.0):
        raise ValueError(
            f"combine_scheds: got {len(pcts)} fractions summing to {sum(pcts)} for {len(scheds)} schedules; "
            "pass one fraction per schedule, summing to 1"
        )
    bounds = [0.0]
    for pct in pcts:
        bounds.append(bounds[-1] + pct)

    def combined(pct: float) -> float:
        i = min(max(bisect.bisect_right(bounds, pct) - 1, 0), len(scheds) - 1)
        width = bounds[i + 1] - bounds[i]
        return scheds[i]((pct - bounds[i]) / width if width > 0 else 1.0)

    return combined


class ParamScheduler(Callback):
    """Set optimizer hyper-parameters from schedules of ``pct_train`` before every training batch.

    ``scheds`` maps a param-group key (``"lr"``, ``"momentum"``, ``"weight_decay"``, ...) to one schedule
    for every param group, or to a list with one schedule per param group.
    """

    order = 60
    run_valid = False
    run_during_sweep = False  # lr_find sets the lr itself

    def __init__(self, scheds: Mapping[str, Annealer | Sequence[Annealer]]) -> None:
        self.scheds: dict[str, Annealer | Sequence[Annealer]] = dict(scheds)

    def before_fit(self) -> None:
        groups = self.learn.opt.param_groups
        for name, sched in self.scheds.items():
            _check_hyper(name, groups, type(self).__name__, type(self.learn.opt).__name__)
            if not callable(sched) and len(sched) != len(groups):
                raise ValueError(
                    f"{type(self).__name__}: {len(sched)} schedules for {name!r} but the optimizer has "
                    f"{len(groups)} param groups; pass one schedule, or one per param group"
                )

    def before_batch(self) -> None:
        pct = self.learn.pct_train
        groups = self.learn.opt.param_groups
        for name, sched in self.scheds.items():
            for i, group in enumerate(groups):
                value = sched(pct) if callable(sched) else sched[i](pct)
                _set_hyper(group, name, value)


class OneCycle(ParamScheduler):
    """The 1cycle policy, step for step equal to ``torch.optim.lr_scheduler.OneCycleLR``.

    Same parameters and defaults as ``OneCycleLR``; ``lr_max=None`` takes ``learn.lr``. The cycle spans
    the whole ``fit`` (``n_epoch * len(dls.train)`` batches).
    """

    def __init__(
        self,
        lr_max: float | Sequence[float] | None = None,
        pct_start: float = 0.3,
        anneal_strategy: Literal["cos", "linear"] = "cos",
        cycle_momentum: bool = True,
        base_momentum: float = 0.85,
        max_momentum: float = 0.95,
        div_factor: float = 25.0,
        final_div_factor: float = 1e4,
        three_phase: bool = False,
    ) -> None:
        if not 0.0 <= pct_start <= 1.0:
            raise ValueError(f"OneCycle: pct_start={pct_start} is outside [0, 1]; pass a fraction like 0.3")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"OneCycle: anneal_strategy={anneal_strategy!r}; use 'cos' or 'linear'")
        super().__init__({})
        self.lr_max = lr_max
        self.pct_start = pct_start
        self.anneal_strategy = anneal_strategy
        self.cycle_momentum = cycle_momentum
        self.base_momentum = base_momentum
        self.max_momentum = max_momentum
        self.div_factor = div_factor
        self.final_div_factor = final_div_factor
        self.three_phase = three_phase

    def before_fit(self) -> None:
        total = _total_steps(self.learn)
        lr_maxes = _per_group(self.lr_max, self.learn, "OneCycle")
        anneal = sched_cos if self.anneal_strategy == "cos" else sched_lin
        self.scheds = {"lr": [self._lr_schedule(lr_max, total, anneal) for lr_max in lr_maxes]}
        if self.cycle_momentum:
            lo, hi = self.base_momentum, self.max_momentum
            ends = [(hi, lo), (lo, hi), (hi, hi)] if self.three_phase else [(hi, lo), (lo, hi)]
            self.scheds["momentum"] = _phased(self._phase_ends(total), ends, anneal, total)
        super().before_fit()

    def _lr_schedule(self, lr_max: float, total: int, anneal: Callable[..., Annealer]) -> Annealer:
        initial = lr_max / self.div_factor
        final = initial / self.final_div_factor
        if self.three_phase:
            ends = [(initial, lr_max), (lr_max, initial), (initial, final)]
        else:
            ends = [(initial, lr_max), (lr_max, final)]
        return _phased(self._phase_ends(total), ends, anneal, total)

    def _phase_ends(self, total: int) -> list[float]:
        """The step at which each phase ends, exactly as ``OneCycleLR`` computes it."""
        if self.three_phase:
            return [float(self.pct_start * total) - 1, float(2 * self.pct_start * total) - 2, total - 1]
        return [float(self.pct_start * total) - 1, total - 1]


class CosineAnnealing(ParamScheduler):
    """Cosine decay of the learning rate from ``lr_max`` (default ``learn.lr``) to ``lr_min`` over the fit.

    Equal to ``torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=n_epoch * len(dls.train))``
    stepped once per batch.
    """

    def __init__(self, lr_max: float | Sequence[float] | None = None, lr_min: float = 0.0) -> None:
        super().__init__({})
        self.lr_max = lr_max
        self.lr_min = lr_min

    def before_fit(self) -> None:
        lr_maxes = _per_group(self.lr_max, self.learn, "CosineAnnealing")
        self.scheds = {"lr": [sched_cos(lr_max, self.lr_min) for lr_max in lr_maxes]}
        super().before_fit()


class LRScheduler(Callback):
    """Drive any ``torch.optim.lr_scheduler`` from the loop, stepping it per batch or per epoch.

    Pass a factory ``fn(optimizer) -> scheduler`` (the optimizer only exists once ``fit`` starts) or a
    scheduler already built on ``learn.opt``. ``interval="step"`` steps after every optimizer step;
    ``"epoch"`` after every epoch. ``ReduceLROnPlateau`` is stepped with the latest epoch's ``monitor``
    value from ``learn.recorder.history``.
    A factory is called at the first ``fit`` (and again if ``learn.opt`` was replaced); later fits
    continue the same scheduler, as a hand-written loop would. The scheduler's state is part of
    :meth:`state_dict`, so checkpoints resume it.
    """

    order = 60
    run_valid = False
    run_during_sweep = False  # lr_find sets the lr itself
    run_after = ("Recorder",)

    def __init__(
        self,
        factory_or_scheduler: Callable[[torch.optim.Optimizer], Any] | Any,
        interval: Literal["step", "epoch"] = "step",
        monitor: str = "valid_loss",
    ) -> None:
        if interval not in ("step", "epoch"):
            raise ValueError(f"LRScheduler: interval={interval!r}; use 'step' or 'epoch'")
        is_scheduler = hasattr(factory_or_scheduler, "step") and hasattr(factory_or_scheduler, "optimizer")
        self.scheduler: Any = factory_or_scheduler if is_scheduler else None
        self.factory = None if is_scheduler else factory_or_scheduler
        self.interval = interval
        self.monitor = monitor
        self._pending_state: dict[str, Any] | None = None

    def before_fit(self) -> None:
        opt = self.learn.opt
        if self.factory is not None and (self.scheduler is None or self.scheduler.optimizer is not opt):
            self.scheduler = self.factory(opt)
        if self.scheduler.optimizer is not opt:
            raise ValueError(
                f"LRScheduler: the {type(self.scheduler).__name__} was built on another optimizer than "
                "learn.opt; pass a factory instead, e.g. LRScheduler(lambda opt: StepLR(opt, 10))"
            )
        plateau = isinstance(self.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
        if plateau and self.learn.dls.valid is None and self.monitor != "train_loss":
            raise ValueError(
                f"LRScheduler: ReduceLROnPlateau monitors {self.monitor!r}, measured on validation data, but "
                "the learner has none; pass hs.DataLoaders(train, valid) or monitor='train_loss'"
            )
        if self._pending_state is not None:
            self.scheduler.load_state_dict(self._pending_state)
            self._pending_state = None

    def after_step(self) -> None:
        if self.interval == "step":
            self.scheduler.step()

    def after_epoch(self) -> None:
        if self.interval != "epoch":
            return
        if isinstance(self.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            self.scheduler.step(_history_value(self.learn, self.monitor, "LRScheduler"))
            return
        self.scheduler.step()

    def state_dict(self) -> dict[str, Any]:
        if self.scheduler is None:
            return {"scheduler": self._pending_state}
        return {"scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("scheduler") is None:
            return
        if self.scheduler is None:
            self._pending_state = state["scheduler"]
            return
        self.scheduler.load_state_dict(state["scheduler"])


def _phased(
    phase_ends: Sequence[float],
    values: Sequence[tuple[float, float]],
    anneal: Callable[[float, float], Annealer],
    total: int,
) -> Annealer:
    """A schedule of ``pct_train`` that anneals ``values[i]`` over phase i, phases ending at the given
    steps — ``OneCycleLR.get_lr`` written as a function of the fraction of training done."""
    curves = [anneal(start, end) for start, end in values]

    def schedule(pct: float) -> float:
        step = round(pct * total)
        start_step = 0.0
        for i, end_step in enumerate(phase_ends[:-1]):
            if step <= end_step:
                return curves[i](_fraction(step, start_step, end_step))
            start_step = end_step
        return curves[-1](_fraction(step, start_step, phase_ends[-1]))

    return schedule


def _fraction(step: int, start_step: float, end_step: float) -> float:
    return (step - start_step) / (end_step - start_step) if end_step > start_step else 1.0


def _total_steps(learn: Any) -> int:
    """Batches in the whole fit: the denominator of ``pct_train``."""
    return learn.n_epoch * len(learn.dls.train)


def _per_group(value: float | Sequence[float] | None, learn: Any, who: str) -> list[float]:
    """One value per param group: ``None`` means the learner's ``lr``; a scalar is repeated."""
    groups = learn.opt.param_groups
    if value is None:
        value = learn.lr
    if isinstance(value, (int, float)):
        return [float(value)] * len(groups)
    if len(value) != len(groups):
        raise ValueError(
            f"{who}: {len(value)} values of lr_max for {len(groups)} param groups; pass one per group"
        )
    return [float(v) for v in value]


def _check_hyper(name: str, groups: list[dict[str, Any]], who: str, opt_name: str) -> None:
    group = groups[0]
    if name == "momentum" and ("betas" in group or "momentum" in group):
        return
    if name in group and name != "params":
        return
    keys = ", ".join(k for k in group if k != "params" and isinstance(group[k], (int, float)))
    hint = " (for OneCycle: cycle_momentum=False)" if name == "momentum" else ""
    raise ValueError(f"{who}: {opt_name} param groups have no {name!r}{hint}; schedule one of: {keys}")


def _set_hyper(group: dict[str, Any], name: str, value: float) -> None:
    if name == "momentum" and "betas" in group:
        group["betas"] = (value, *group["betas"][1:])
        return
    group[name] = value


def _history_value(learn: Any, key: str, who: str) -> float:
    """The latest epoch's value of ``key`` from the Recorder, with a clear error when it is missing."""
    history = learn.recorder.history
    if not history or key not in history[-1]:
        keys = ", ".join(history[-1]) if history else "none yet"
        raise KeyError(f"{who}: no {key!r} in learn.recorder.history (available: {keys}); pass monitor=")
    return history[-1][key]


def __getattr__(name: str) -> Any:
    if name != "Schedule":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    deprecated(f"{__name__}.Schedule is now Annealer; the old name goes in the next release")
    return Annealer
