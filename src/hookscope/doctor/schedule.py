"""When the doctor records: the adaptive schedule that keeps ``Doctor()`` cheap at its defaults.

Recording a step (activation and output-gradient statistics of every watched layer, gradient norms,
update ratios) costs about a third of a small CNN's step; the loss, read in bulk at each check, costs
nothing. So the expensive statistics are taken on a schedule:

- every step of the first ``warmup`` steps: faults of the initialisation (dead units, exploding or
  vanishing gradients, a layer missing from the optimizer) are found as fast as with ``every=1``;
- then every ``every``-th step;
- every step again from a check that found a condition holding on the latest record but not yet for
  ``patience`` records (a suspicion), until a check finds none: the finding then comes within a check
  or two instead of ``patience`` sparse records.

The decision is a pure function of the step and of ``alert_until``, which only checks change, so a run
resumed from a checkpoint (which keeps ``alert_until``) records exactly the steps the uninterrupted run
records.
"""

from __future__ import annotations

from typing import Any


class Schedule:
    """Record every step below ``warmup`` and below ``alert_until``, else every ``every``-th step."""

    def __init__(self, warmup: int = 10, every: int = 50) -> None:
        if warmup < 0 or every < 1:
            raise ValueError(f"Schedule: warmup={warmup}, every={every}; use warmup >= 0 and every >= 1")
        self.warmup, self.every = warmup, every
        self.alert_until = 0

    def __call__(self, step: int) -> bool:
        return step < self.warmup or step < self.alert_until or step % self.every == 0

    def tighten(self, until: int) -> None:
        """Record every step up to (not including) step ``until``."""
        self.alert_until = max(self.alert_until, until)

    def state_dict(self) -> dict[str, Any]:
        return {"alert_until": self.alert_until}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.alert_until = int(state["alert_until"])
