"""``lr_schedule``: the learning rate collapses early, or grows without bound.

The learning rate of each param group (``optimizer.param_groups[i]["lr"]``, a host number; a tensor
learning rate on an accelerator is skipped rather than read) is followed at every optimizer step:

- **collapse**: below :data:`COLLAPSE` (1/1000) of its peak so far, first reached within the first tenth
  of the run, and never back above :data:`RECOVERED` (1/100) of that peak since — what a scheduler built for
  epochs (``StepLR(step_size=30)``, ``ExponentialLR``) does when ``scheduler.step()`` runs after every batch.
  The run's length is ``total_steps`` when the loop knows it (the Learner); otherwise the steps seen so
  far, so a collapse at step c is reported once the run reached 10·c steps (or at close). Warm-up then
  cosine decay, or one-cycle, reach 1/1000 of the peak only at the end of the run: silent. A periodic
  schedule that climbs back (``CosineAnnealingLR`` with ``T_max`` in epochs stepped per batch, warm
  restarts) is not reported; a param group switched off on purpose early (its lr set to 0) is.
- **growth**: at close, the last learning rate is above :data:`GROWTH` (10x) its first, is the highest so
  far, and still rose over the last tenth of the run (a gamma above 1, a warm-up factor without a cap). A
  run stopped during a long warm-up, or an LR range test, looks the same. Another fit after the close
  (``learn.fit`` again on the same Doctor) reopens the run: its warm-up is judged at its own close, not
  at every check as if the run had ended.

The scheduler is named when the loop passes ``schedulers`` (torch schedulers are not reachable from the
optimizer; a name stands for a scheduler the loop drives itself, such as the Learner's ``OneCycle``);
otherwise "a scheduler" when one set ``initial_lr`` in the group, "something" when none did.
"""

from __future__ import annotations

from typing import Any

import torch

from hookscope.doctor.findings import Finding

COLLAPSE = 1e-3
RECOVERED = 1e-2
GROWTH = 10.0
HISTORY = 128


class _Group:
    """One param group's learning rate: first, peak, collapse, and a thinned history for the growth."""

    def __init__(self, lr: float, step: int) -> None:
        self.first = self.peak = self.last = lr
        self.collapse: tuple[int, float, float] | None = None  # step, lr, peak then
        self.recovered = False
        self.history: list[tuple[int, float]] = [(step, lr)]
        self.stride = 1

    def update(self, lr: float, step: int, seen: int) -> None:
        self.last = lr
        if self.collapse is not None and lr > RECOVERED * self.collapse[2]:
            self.recovered = True
        self.peak = max(self.peak, lr)
        if self.collapse is None and lr < COLLAPSE * self.peak:
            self.collapse = (step, lr, self.peak)
        if seen % self.stride == 0:
            self.history.append((step, lr))
            if len(self.history) > HISTORY:
                del self.history[1::2]
                self.stride *= 2

    def state(self) -> list[Any]:
        return [self.first, self.peak, self.last, self.collapse, self.recovered, self.history, self.stride]

    @classmethod
    def from_state(cls, state: list[Any]) -> _Group:
        group = cls(float(state[0]), 0)
        group.peak, group.last, collapse = float(state[1]), float(state[2]), state[3]
        group.collapse = (int(collapse[0]), float(collapse[1]), float(collapse[2])) if collapse else None
        group.recovered, group.stride = bool(state[4]), int(state[6])
        group.history = [(int(s), float(v)) for s, v in state[5]]
        return group


class LearningRateSchedule:
    """Follows every param group's learning rate (see the module)."""

    def __init__(self, total_steps: int | None = None, schedulers: Any = ()) -> None:
        self.total_steps = total_steps
        self.schedulers = list(schedulers)
        self._optimizer: torch.optim.Optimizer | None = None
        self._groups: list[_Group | None] = []
        self._step = 0
        self._seen = 0
        self._closed = False

    def watch_optimizer(self, optimizer: torch.optim.Optimizer | None) -> None:
        self._optimizer = optimizer

    def begin_batch(self, step: int, training: bool) -> None:
        if training:
            self._step = step
            self._closed = False  # a training batch after close: the run goes on (another fit)

    def step_done(self) -> None:
        """Read the learning rates the step used (they may change after it, by a scheduler)."""
        if self._optimizer is None:
            return
        self._seen += 1
        groups = self._optimizer.param_groups
        if len(self._groups) != len(groups):
            self._groups = [None] * len(groups)
        for i, group in enumerate(groups):
            lr = _host_lr(group.get("lr"))
            if lr is None:
                continue
            tracked = self._groups[i]
            if tracked is None:
                self._groups[i] = _Group(lr, self._step)
            else:
                tracked.update(lr, self._step, self._seen)

    def close(self) -> None:
        self._closed = True

    def findings(self) -> list[Finding]:
        found = []
        for i, group in enumerate(self._groups):
            if group is None:
                continue
            if self._collapsed(group):
                found.append(self._collapse_finding(i, group))
            elif self._closed and _grows(group):
                found.append(self._growth_finding(i, group))
        return found

    def state_dict(self) -> dict[str, Any]:
        return {
            "seen": self._seen,
            "groups": [g.state() if g is not None else None for g in self._groups],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._seen = int(state["seen"])
        self._groups = [_Group.from_state(g) if g is not None else None for g in state["groups"]]

    def _collapsed(self, group: _Group) -> bool:
        if group.collapse is None or group.recovered:
            return False
        run = self.total_steps or self._seen
        return group.collapse[0] < run / 10

    def _collapse_finding(self, i: int, group: _Group) -> Finding:
        assert group.collapse is not None
        step, lr, peak = group.collapse
        run = f"{self.total_steps} steps" if self.total_steps else f"{self._seen} steps so far"
        message = (
            f"the learning rate of param group {i} fell from its peak {peak:.3g} to {lr:.3g} (below "
            f"1/1000 of it) by step {step}, within the first tenth of the run ({run}), and stayed there: "
            f"{self._scheduler(i)} decays it far too fast — typically a scheduler built for epochs "
            "(StepLR, ExponentialLR, MultiStepLR) whose `step()` runs after every batch. Call "
            "`scheduler.step()` once per epoch, or give it its length in batches."
        )
        evidence = {"group": i, "peak": peak, "lr": lr, "scheduler": self._scheduler(i)}
        return Finding("lr_schedule", "", step, "error", message, evidence)

    def _growth_finding(self, i: int, group: _Group) -> Finding:
        message = (
            f"the learning rate of param group {i} grew from {group.first:.3g} to {group.last:.3g} "
            f"({group.last / group.first:.0f}x) and was still rising when the run ended: "
            f"{self._scheduler(i)} makes it grow without bound — a factor above 1 (gamma), or a warm-up "
            "that never stops. Check the scheduler's arguments: a warm-up should end at the peak rate."
        )
        evidence = {"group": i, "first": group.first, "last": group.last, "scheduler": self._scheduler(i)}
        return Finding("lr_schedule", "", group.history[-1][0], "warning", message, evidence)

    def _scheduler(self, i: int) -> str:
        names = [
            s if isinstance(s, str) else type(s).__name__
            for s in self.schedulers
            if isinstance(s, str) or getattr(s, "optimizer", None) is self._optimizer
        ]
        if names:
            return " + ".join(names)
        groups = self._optimizer.param_groups if self._optimizer is not None else []
        return "a scheduler" if i < len(groups) and "initial_lr" in groups[i] else "something"


def _grows(group: _Group) -> bool:
    """Above GROWTH times its first value, at its highest, and still rising over the last tenth."""
    if group.first <= 0 or len(group.history) < 10:
        return False
    end = group.history[-1][0]
    start = group.history[0][0]
    earlier = [lr for step, lr in group.history if step <= end - (end - start) / 10]
    return (
        group.last > GROWTH * group.first
        and group.last >= group.peak * (1 - 1e-9)
        and bool(earlier)
        and group.last > 1.05 * earlier[-1]
    )


def _host_lr(lr: Any) -> float | None:
    """The learning rate as a host float; None for a tensor on an accelerator (reading it would sync)."""
    if isinstance(lr, torch.Tensor):
        return float(lr) if lr.device.type == "cpu" else None
    return float(lr) if isinstance(lr, int | float) else None
