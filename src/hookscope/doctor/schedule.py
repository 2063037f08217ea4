"""When the doctor records: the cadence, decided once per training step by its owner.

Recording a step (activation and output-gradient statistics of every watched layer, gradient norms,
update ratios, saturation) costs about a third of a small CNN's step; the loss, read in bulk at each
check, costs nothing. So the expensive statistics are taken on a :class:`Cadence`, which the engine (or a
standalone ``ActivationStats`` / ``GradientStats``) asks once at the start of each training step; the
recorders get its answer as a boolean and never decide themselves.

A cadence is either a fixed interval, ``every``, which doubles each time a recorder thins its bounded
history (so the history keeps an even density), or the adaptive :class:`RecordingSchedule` (the
doctor's default):

- every step of the first ``warmup`` (5) steps: faults of the initialisation (dead units, exploding or
  vanishing gradients, a layer missing from the optimizer) are found at the engine's first check, at
  the warm-up's end — sooner than with ``every=1``, whose first check comes after ``check_every``
  steps — since a rule needs its condition on ``patience`` (3) records in a row;
- then every ``every``-th step (this interval does not change when a history is thinned: the records
  after a thinning are denser than the thinned ones before it);
- every step again from a check that found a condition holding on the latest record but not yet for
  ``patience`` records (a suspicion), until a check finds none: the finding then comes within a check
  or two instead of ``patience`` sparse records.

The decision is a pure function of the step, of ``alert_until`` (only checks change it) and of how
often the histories were thinned, all kept in checkpoints, so a resumed run records exactly the steps
the uninterrupted run records.
"""

from __future__ import annotations

import warnings
from typing import Any


class RecordingSchedule:
    """Record every step below ``warmup`` and below ``alert_until``, else the first ``window`` steps of
    every ``every`` (``window=1``: every ``every``-th step)."""

    def __init__(self, warmup: int = 5, every: int = 50, window: int = 1) -> None:
        if warmup < 0 or every < 1 or not 1 <= window <= every:
            raise ValueError(
                f"RecordingSchedule: warmup={warmup}, every={every}, window={window}; use warmup >= 0, "
                "every >= 1 and 1 <= window <= every"
            )
        self.warmup, self.every, self.window = warmup, every, window
        self.alert_until = 0

    def __call__(self, step: int) -> bool:
        return step < self.warmup or step < self.alert_until or step % self.every < self.window

    def tighten(self, until: int) -> None:
        """Record every step up to (not including) step ``until``."""
        self.alert_until = max(self.alert_until, until)

    def state_dict(self) -> dict[str, Any]:
        return {"alert_until": self.alert_until}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.alert_until = int(state["alert_until"])


class Cadence:
    """Whether a training step is recorded: every ``every``-th step (``every`` doubled at each thinning
    of the histories it feeds), or, with ``every=None``, the adaptive :class:`RecordingSchedule`.

    ``owner`` names the caller in the error a bad ``every`` raises.
    """

    def __init__(self, every: int | None, owner: str = "Doctor") -> None:
        if every is not None and (not isinstance(every, int) or every < 1):
            raise ValueError(f"{owner}: every={every!r}; use every >= 1 (or None: the adaptive schedule)")
        self.schedule = RecordingSchedule() if every is None else None
        self.base = every or 1
        self.thinnings = 0

    @property
    def warmup(self) -> int:
        """Training steps of the adaptive schedule's warm-up (0 for a fixed interval): the engine's first
        check comes at its end."""
        return self.schedule.warmup if self.schedule is not None else 0

    @property
    def every(self) -> int:
        """The recording interval now, in training steps (under the adaptive schedule: its sparse one)."""
        return self.schedule.every if self.schedule is not None else self.base << self.thinnings

    def __call__(self, step: int) -> bool:
        if self.schedule is not None:
            return self.schedule(step)
        return step % (self.base << self.thinnings) == 0

    def follow(self, thinnings: int) -> None:
        """The histories recorded on this cadence were thinned ``thinnings`` times (the most of any): a
        fixed interval doubles as often, so new records come at the density of the kept ones."""
        self.thinnings = thinnings


def __getattr__(name: str) -> Any:
    if name == "Schedule":
        warnings.warn(
            "hookscope.doctor.schedule.Schedule is now RecordingSchedule; the old name goes in the next "
            "release",
            DeprecationWarning,
            stacklevel=2,
        )
        return RecordingSchedule
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
