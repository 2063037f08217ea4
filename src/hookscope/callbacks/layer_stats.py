"""ActivationStats and GradientStats: per-layer statistics during a fit, without a host sync per step.

Each callback is a thin standalone adapter: it turns the Learner's events into the feed calls of a
recorder of :mod:`hookscope.doctor.recorders` (where the statistics, their bounded histories and their
checkpoint state live) and decides once per training step, with a
:class:`~hookscope.doctor.schedule.Cadence`, whether the step is recorded — as the doctor's engine does for
its own recorders. Everything is keyed by the qualified module (or parameter) name and by
``learn.training_step`` as it was when the batch started.

:func:`layer_statistics` is the one way to find the statistics a fit recorded: the Doctor's (its engine
records activations and gradients) or a standalone callback's.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hookscope import compat
from hookscope.doctor.record_types import ParamRecord, StepStats
from hookscope.doctor.recorders import ActivationRecorder, GradientRecorder
from hookscope.doctor.schedule import Cadence
from hookscope.doctor.selection import with_parameters
from hookscope.hooks.select import Spec
from hookscope.train.callback import Callback

if TYPE_CHECKING:
    from hookscope.train.learner import Learner

__all__ = [
    "ActivationStats",
    "GradientStats",
    "LayerStatistics",
    "ParamRecord",
    "StepStats",
    "layer_statistics",
    "with_parameters",
]


@dataclass(frozen=True)
class LayerStatistics:
    """The recorders holding a fit's per-layer statistics (None: nothing recorded them)."""

    activations: ActivationRecorder | None = None
    gradients: GradientRecorder | None = None


def layer_statistics(learn: Learner | None) -> LayerStatistics:
    """The statistics ``learn``'s callbacks record: for each kind, the first callback (in ``learn.cbs``
    order) whose ``layer_statistics`` has it — a Doctor has both, ``ActivationStats`` and
    ``GradientStats`` one each. Any callback may offer statistics by defining ``layer_statistics``."""
    activations = gradients = None
    for cb in learn.cbs if learn is not None else ():
        found = getattr(cb, "layer_statistics", None)
        if not isinstance(found, LayerStatistics):
            continue
        activations = activations or found.activations
        gradients = gradients or found.gradients
    return LayerStatistics(activations, gradients)


class _StatsCallback(Callback):
    """What both statistics callbacks do: feed their ``recorder`` the Learner's events, deciding once per
    training step with their ``cadence`` whether the step is recorded."""

    order = 15
    cadence: Cadence
    recorder: ActivationRecorder | GradientRecorder

    @property
    def every(self) -> int:
        """The recording interval now, in steps (``every``, doubled at each thinning of the history)."""
        self.cadence.follow(self.recorder.thinnings)
        return self.cadence.every

    @property
    def stride(self) -> int:
        """Deprecated name of :attr:`every`."""
        warnings.warn(
            f"{type(self).__name__}.stride is now .every; the old name goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.every

    @property
    def history(self) -> dict[str, list[StepStats]]:
        """Training records per layer (qualified name), oldest first; reads pending records first."""
        return self.recorder.history

    def flush(self) -> None:
        """Copy everything pending to the host in one transfer and append it to the histories."""
        self.recorder.flush()

    def before_fit(self) -> None:
        self.recorder.attach(compat.uncompiled(self.learn.model))  # names as in the eager model

    def before_batch(self) -> None:
        training, step = self.learn.training, self.learn.training_step
        self.recorder.begin_batch(step, training, training and self._recorded(step))

    def after_batch(self) -> None:
        if self.learn.training:
            self.recorder.end_batch()

    def after_fit(self) -> None:
        self.recorder.close()

    def on_failure(self, exc: BaseException) -> None:
        self.recorder.fail()

    def state_dict(self) -> dict[str, Any]:
        """The host histories (thinned to ``SAVED_RECORDS`` per layer) and how often they were thinned;
        {} before a fit."""
        return self.recorder.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the histories; the next ``fit`` continues them when it watches the same layers."""
        self.recorder.load_state_dict(state)

    def _recorded(self, step: int) -> bool:
        self.cadence.follow(self.recorder.thinnings)
        return self.cadence(step)


class ActivationStats(_StatsCallback):
    """Statistics of the outputs of the layers ``select`` picks (see :func:`hookscope.select`; None, the
    default: the leaf modules that own parameters, :func:`with_parameters`; every leaf module, ReLUs
    included: :func:`hookscope.hooks.select.leaves`).

    Records training batches whose step is a multiple of ``every`` (``every`` doubles each time the
    bounded ``history`` is thinned, so the history spans the whole run at an even density: read it as
    :attr:`every`); validation too when ``include_valid`` (one record per validation phase, in
    ``valid_history``). ``bins`` and ``range`` define the histograms of the colorful-dimension plot; the
    histogram, ``abs_max`` and ``zero_fraction`` are taken over at most ``sample`` values per tensor,
    everything else over every value (see :mod:`hookscope.hooks.stats`; None: all exact). Pending
    statistics are read to the host every ``read_every`` recorded steps. Hooks live from ``before_fit``
    to ``after_fit``, only during recorded steps, and are removed on failure too.
    """

    recorder: ActivationRecorder

    def __init__(
        self,
        select: Spec = None,
        every: int = 1,
        include_valid: bool = False,
        bins: int = 50,
        range: tuple[float, float] = (-5.0, 5.0),
        sample: int | None = 2048,
        history: int = 1000,
        read_every: int = 100,
    ) -> None:
        self.cadence = Cadence(every, "ActivationStats")
        self.recorder = ActivationRecorder(
            select=with_parameters if select is None else select,
            include_valid=include_valid,
            bins=bins,
            range=range,
            sample=sample,
            history=history,
            read_every=read_every,
        )

    @property
    def layer_statistics(self) -> LayerStatistics:
        return LayerStatistics(activations=self.recorder)

    @property
    def valid_history(self) -> dict[str, list[StepStats]]:
        """One record per validation phase per layer (only with ``include_valid=True``)."""
        return self.recorder.valid_history

    def latest(self) -> dict[str, StepStats]:
        """The most recent training record of every layer that has one."""
        return self.recorder.latest()

    def before_validate(self) -> None:
        self.recorder.begin_valid()

    def after_validate(self) -> None:
        self.recorder.end_valid(self.learn.training_step)


class GradientStats(_StatsCallback):
    """Gradient norms and update-to-weight ratios per parameter; on request, output-gradient stats per layer.

    Every ``every`` training steps (``every`` doubles each time the bounded ``history`` is thinned; read
    it as :attr:`every`): the norm of each trainable parameter's gradient, read in ``before_step`` after
    mixed-precision unscaling and before clipping (a step that an earlier callback cancels there is not
    recorded), and the ratio ``||Δw|| / ||w||`` of that step's ``opt.step()`` (``update_ratio=True``).
    With ``output_grads=True``, also statistics of the gradient flowing out of each ``select``-ed module
    (None, the default: :func:`with_parameters`; every leaf module: :func:`hookscope.hooks.select.leaves`;
    their ``history``), taken with tensor
    hooks so in-place ops after a module do not break them. They are off by default: they cost as much as
    :class:`ActivationStats` (a CNN's output gradients are as large as its activations), while the
    per-parameter norms, what the gradient-flow plot shows, cost a fraction of that (on the small CNN of
    ``benchmarks/stats_overhead.py``: 1-3% of a step against 4-8%).
    """

    run_after = ("MixedPrecision",)  # the norms of unscaled gradients
    run_before = ("GradientClip", "GradientClipValue")  # the norms before clipping changes them
    recorder: GradientRecorder

    def __init__(
        self,
        every: int = 1,
        select: Spec = None,
        output_grads: bool = False,
        update_ratio: bool = True,
        bins: int = 50,
        range: tuple[float, float] = (-1e-3, 1e-3),
        sample: int | None = 2048,
        history: int = 1000,
        read_every: int = 100,
    ) -> None:
        self.cadence = Cadence(every, "GradientStats")
        self.recorder = GradientRecorder(
            select=with_parameters if select is None else select,
            output_grads=output_grads,
            update_ratio=update_ratio,
            bins=bins,
            range=range,
            sample=sample,
            history=history,
            read_every=read_every,
        )

    @property
    def layer_statistics(self) -> LayerStatistics:
        return LayerStatistics(gradients=self.recorder)

    @property
    def param_history(self) -> dict[str, list[ParamRecord]]:
        """Gradient norm and update ratio per trainable parameter (qualified name), oldest first."""
        return self.recorder.param_history

    def before_step(self) -> None:
        self.recorder.gradients_ready()

    def after_step(self) -> None:
        self.recorder.step_done()

    def after_cancel_step(self) -> None:
        self.recorder.step_cancelled()
