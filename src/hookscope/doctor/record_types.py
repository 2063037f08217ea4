"""The plain records the doctor keeps: one layer over one recorded step, one parameter at one step."""

from __future__ import annotations

from dataclasses import dataclass

from hookscope.hooks.stats import TensorStats


@dataclass(frozen=True)
class StepStats:
    """The statistics of one layer over one recorded step (or one validation phase)."""

    step: int
    stats: TensorStats


@dataclass(frozen=True)
class ParamRecord:
    """One parameter at one recorded step: gradient norm (None: it got no gradient) and update ratio.

    ``update_ratio`` is ``||w_after - w_before|| / ||w_after||`` of that step's ``opt.step()``, or None
    when the step did not happen (cancelled) or ratios are switched off.
    """

    step: int
    grad_norm: float | None
    update_ratio: float | None
