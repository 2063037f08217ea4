"""ActivationStats and GradientStats: per-layer statistics during a fit, without a host sync per step.

Each callback is a thin adapter: it turns the Learner's events into the feed calls of a recorder of
:mod:`hookscope.doctor.records` (where the statistics, their bounded histories and their checkpoint state
live), so the Learner, the Doctor and ``hs.watch`` record exactly the same way. Everything is keyed by the
qualified module (or parameter) name and by ``learn.training_step`` as it was when the batch started.
"""

from __future__ import annotations

from typing import Any

from hookscope.doctor.records import (
    ActivationRecorder,
    GradientRecorder,
    ParamRecord,
    StepStats,
    with_parameters,
)
from hookscope.hooks.select import Spec
from hookscope.train.callback import Callback

__all__ = ["ActivationStats", "GradientStats", "ParamRecord", "StepStats", "with_parameters"]


class ActivationStats(Callback):
    """Statistics of the outputs of the selected layers (an ``hs.select`` spec; default: the leaf modules
    that own parameters, see :func:`with_parameters`; None = every leaf module, ReLUs included).

    Records training batches whose step is a multiple of ``every`` (the interval doubles each time the
    bounded ``history`` is thinned); validation too when ``include_valid`` (one record per validation
    phase, in ``valid_history``). ``bins`` and ``range`` define the histograms of the colorful-dimension
    plot; the histogram, ``abs_max`` and ``zero_fraction`` are taken over at most ``sample`` values per
    tensor, everything else over every value (see :mod:`hookscope.hooks.stats`; None: all exact).
    Hooks live from ``before_fit`` to ``after_fit`` and are removed on failure too. ``recorder``: an
    existing :class:`~hookscope.doctor.records.ActivationRecorder` to drive (the Doctor's), instead of
    one built from the other arguments.
    """

    order = 15

    def __init__(
        self,
        select: Spec = with_parameters,
        every: int = 1,
        include_valid: bool = False,
        bins: int = 50,
        range: tuple[float, float] = (-5.0, 5.0),
        sample: int | None = 2048,
        history: int = 1000,
        read_every: int = 100,
        *,
        recorder: ActivationRecorder | None = None,
    ) -> None:
        self.recorder = recorder or ActivationRecorder(
            select, every, include_valid, bins, range, sample, history, read_every
        )

    @property
    def history(self) -> dict[str, list[StepStats]]:
        """Training records per layer (qualified name), oldest first; reads pending snapshots first."""
        return self.recorder.history

    @property
    def valid_history(self) -> dict[str, list[StepStats]]:
        """One record per validation phase per layer (only with ``include_valid=True``)."""
        return self.recorder.valid_history

    @property
    def stride(self) -> int:
        """The recording interval in steps (``every``, doubled at each thinning of the history)."""
        return self.recorder.stride

    def latest(self) -> dict[str, StepStats]:
        """The most recent training record of every layer that has one."""
        return self.recorder.latest()

    def flush(self) -> None:
        """Copy every pending snapshot to the host in one transfer and append them to the histories."""
        self.recorder.flush()

    def before_fit(self) -> None:
        self.recorder.attach(self.learn.model)

    def before_batch(self) -> None:
        self.recorder.begin_batch(self.learn.training_step, self.learn.training)

    def after_batch(self) -> None:
        if self.learn.training:
            self.recorder.end_batch()

    def before_validate(self) -> None:
        self.recorder.begin_valid()

    def after_validate(self) -> None:
        self.recorder.end_valid(self.learn.training_step)

    def after_fit(self) -> None:
        self.recorder.close()

    def on_failure(self, exc: BaseException) -> None:
        self.recorder.fail()

    def state_dict(self) -> dict[str, Any]:
        """The host histories (thinned to ``SAVED_RECORDS`` per layer) and the record interval; {} before
        a fit."""
        return self.recorder.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the histories; the next ``fit`` continues them when it watches the same layers."""
        self.recorder.load_state_dict(state)


class GradientStats(Callback):
    """Gradient norms and update-to-weight ratios per parameter; on request, output-gradient stats per layer.

    Every ``every`` training steps: the norm of each trainable parameter's gradient, read in
    ``before_step`` after mixed-precision unscaling and before clipping (a step that an earlier callback
    cancels there is not recorded), and the ratio ``||Δw|| / ||w||`` of that step's ``opt.step()``
    (``update_ratio=True``). With ``output_grads=True``, also statistics of the gradient flowing out of
    each ``select``-ed module (default :func:`with_parameters`; None = every leaf module), taken with
    tensor hooks so in-place ops after a module do not break them. They are off by default: they cost as
    much as :class:`ActivationStats` (a CNN's output gradients are as large as its activations), while
    the per-parameter norms, what the gradient-flow plot shows, cost a fraction of that (on the small
    CNN of ``benchmarks/stats_overhead.py``: 1-3% of a step against 4-8%). ``recorder``: an existing
    :class:`~hookscope.doctor.records.GradientRecorder` to drive (the Doctor's).
    """

    order = 15
    run_before = ("GradientClip", "GradientClipValue")  # the norms before clipping changes them

    def __init__(
        self,
        every: int = 1,
        select: Spec = with_parameters,
        output_grads: bool = False,
        update_ratio: bool = True,
        bins: int = 50,
        range: tuple[float, float] = (-1e-3, 1e-3),
        sample: int | None = 2048,
        history: int = 1000,
        read_every: int = 100,
        *,
        recorder: GradientRecorder | None = None,
    ) -> None:
        self.recorder = recorder or GradientRecorder(
            every, select, output_grads, update_ratio, bins, range, sample, history, read_every
        )

    @property
    def history(self) -> dict[str, list[StepStats]]:
        """Output-gradient statistics per layer (qualified name), oldest first."""
        return self.recorder.history

    @property
    def param_history(self) -> dict[str, list[ParamRecord]]:
        """Gradient norm and update ratio per trainable parameter (qualified name), oldest first."""
        return self.recorder.param_history

    @property
    def stride(self) -> int:
        """The recording interval in steps (``every``, doubled at each thinning of the history)."""
        return self.recorder.stride

    def flush(self) -> None:
        """Copy everything pending to the host in one transfer and append it to the histories."""
        self.recorder.flush()

    def before_fit(self) -> None:
        self.recorder.attach(self.learn.model)

    def before_batch(self) -> None:
        self.recorder.begin_batch(self.learn.training_step, self.learn.training)

    def before_step(self) -> None:
        self.recorder.gradients_ready()

    def after_step(self) -> None:
        self.recorder.step_done()

    def after_cancel_step(self) -> None:
        self.recorder.step_cancelled()

    def after_batch(self) -> None:
        if self.learn.training:
            self.recorder.end_batch()

    def after_fit(self) -> None:
        self.recorder.close()

    def on_failure(self, exc: BaseException) -> None:
        self.recorder.fail()

    def state_dict(self) -> dict[str, Any]:
        """Parameter (and output-gradient) histories, thinned to ``SAVED_RECORDS`` per layer, and the
        record interval."""
        return self.recorder.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the histories; the next ``fit`` continues them when the model has the same parameters."""
        self.recorder.load_state_dict(state)
