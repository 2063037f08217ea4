"""The learning-rate finder: train briefly while the lr grows exponentially, and watch the loss.

``find_lr`` (``learn.lr_find()``) runs the sweep through the normal loop — mixed precision, clipping
and accumulation apply as in ``fit`` — and puts the model weights and gradients, the optimizer state, the
loss scaler of ``MixedPrecision``, ``learn.training_step`` and the torch random state back afterwards.

Which callbacks sit out the sweep is decided in one place, :func:`sits_out_sweeps`: a callback whose class
sets ``run_during_sweep = False`` is detached for the sweep and put back after it, in its place. The
built-in ones that do are those that schedule or stop a real run (``ParamScheduler`` and its subclasses,
``LRScheduler``, ``EarlyStopping``), write the run's record (``MetricsLogger``, ``Checkpoint``,
``RunFolder``, the trackers) or diagnose it (``Doctor``): a sweep is a throw-away copy of the run whose
steps are not the run's. Every other callback runs during the sweep, as in fastai; a callback of your own
that must not sets the same attribute.

Suggested learning rate (``LRFindResult.suggested_lr``), fastai's "valley" rule: on the smoothed loss
(first 10% and last 5 points trimmed), find the longest stretch over which the loss keeps decreasing
and take the lr halfway down it — far enough from the minimum to be stable, where the loss still falls
fast. ``suggestions`` also holds ``"steepest"`` (the lr where the smoothed loss falls fastest against
log-lr) and ``"minimum"`` (the lr of the lowest smoothed loss, divided by 10).
"""

from __future__ import annotations

import copy
import math
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from hookscope.callbacks.precision import MixedPrecision
from hookscope.callbacks.schedule import LRScheduler, ParamScheduler, sched_exp
from hookscope.train.callback import Callback
from hookscope.train.checkpoint import capture_rng, restore_rng, rng_generators
from hookscope.train.data import require_batches
from hookscope.train.events import CancelFitException, CancelValidException

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from hookscope.train.learner import Learner

_DIVERGED = 4.0  # the sweep stops once the smoothed loss exceeds this multiple of its best value


@dataclass
class LRFindResult:
    """The sweep: one lr, raw loss and smoothed loss per batch, and the suggested learning rates."""

    lrs: list[float]
    losses: list[float]
    smoothed: list[float]
    suggestions: dict[str, float] = field(default_factory=dict)

    @property
    def suggested_lr(self) -> float:
        """The "valley" suggestion (see the module docstring)."""
        return self.suggestions["valley"]

    def plot(self, ax: Axes | None = None) -> Figure:
        """Smoothed loss against lr (log scale) with the suggestions marked; returns the Figure.

        The y axis stops at twice the starting loss, so the blow-up at the end does not flatten the
        part of the curve that matters.
        """
        from matplotlib.figure import Figure  # matplotlib loads when a figure is drawn

        fig = Figure(figsize=(6, 4)) if ax is None else ax.figure
        ax = fig.add_subplot() if ax is None else ax
        ax.plot(self.lrs, self.smoothed, label="smoothed loss")
        for (name, lr), marker in zip(self.suggestions.items(), "ovs", strict=False):
            ax.plot([lr], [np.interp(math.log(lr), np.log(self.lrs), self.smoothed)], marker, label=name)
        finite = [v for v in self.smoothed if math.isfinite(v)]
        low, high = min(finite), min(max(finite), 2 * finite[0])
        if high > low:
            margin = 0.05 * (high - low)
            ax.set_ylim(low - margin, high + margin)
        ax.set_xscale("log")
        ax.set_xlabel("learning rate")
        ax.set_ylabel("loss")
        ax.legend()
        return fig


def sits_out_sweeps(cb: Callback) -> bool:
    """True for a callback that an lr_find sweep detaches: its class sets ``run_during_sweep = False``
    (:class:`~hookscope.Callback` declares it True)."""
    return not getattr(cb, "run_during_sweep", True)


def sweeping(learn: Learner) -> bool:
    """Deprecated: callbacks that must not see a sweep set ``run_during_sweep = False`` and are detached
    from it (see :func:`sits_out_sweeps`). True while ``learn`` runs an lr_find sweep."""
    warnings.warn(
        "hookscope.callbacks.lr_finder.sweeping is deprecated: set run_during_sweep = False on the callback "
        "class and lr_find detaches it for the sweep",
        DeprecationWarning,
        stacklevel=2,
    )
    return any(isinstance(cb, LRFinder) for cb in learn.cbs)


class LRFinder(Callback):
    """Set the lr to ``start_lr * (end_lr / start_lr) ** (i / (num_it - 1))`` at training batch ``i``,
    record each loss (read once per batch: the sweep needs it to stop), skip validation, and stop after
    ``num_it`` batches or when the smoothed loss diverges (``stop_div``). It changes the weights: use it
    through ``learn.lr_find()``, which puts everything back. ``learn.lr_finder`` exists only during a
    sweep."""

    order = 60
    run_after = (ParamScheduler, LRScheduler)

    def __init__(
        self,
        start_lr: float = 1e-7,
        end_lr: float = 10.0,
        num_it: int = 100,
        stop_div: bool = True,
        beta: float = 0.98,
    ) -> None:
        if not 0 < start_lr < end_lr:
            raise ValueError(
                f"LRFinder: need 0 < start_lr < end_lr, got start_lr={start_lr}, end_lr={end_lr}"
            )
        if num_it < 2:
            raise ValueError(f"LRFinder: num_it={num_it} must be >= 2")
        self.schedule = sched_exp(start_lr, end_lr)
        self.num_it = num_it
        self.stop_div = stop_div
        self.beta = beta
        self._reset()

    def before_fit(self) -> None:
        self._reset()

    def before_batch(self) -> None:
        if not self.learn.training:
            return
        lr = self.schedule(self.learn.train_iter / (self.num_it - 1))
        for group in self.learn.opt.param_groups:
            group["lr"] = lr

    def after_batch(self) -> None:
        if not self.learn.training or self.learn.loss is None:
            return
        loss = float(self.learn.loss.float().mean())
        self.lrs.append(self.learn.opt.param_groups[0]["lr"])
        self.losses.append(loss)
        self._ema = self.beta * self._ema + (1 - self.beta) * loss
        smooth = self._ema / (1 - self.beta ** len(self.losses))
        self.smoothed.append(smooth)
        self._best = min(self._best, smooth)
        diverged = not math.isfinite(smooth) or smooth > _DIVERGED * self._best
        if (self.stop_div and diverged) or len(self.losses) >= self.num_it:
            raise CancelFitException()

    def before_validate(self) -> None:
        raise CancelValidException()

    def result(self) -> LRFindResult:
        """The recorded sweep with its suggestions."""
        return LRFindResult(
            lrs=list(self.lrs),
            losses=list(self.losses),
            smoothed=list(self.smoothed),
            suggestions=suggest_lrs(self.lrs, self.smoothed),
        )

    def _reset(self) -> None:
        self.lrs: list[float] = []
        self.losses: list[float] = []
        self.smoothed: list[float] = []
        self._ema = 0.0
        self._best = math.inf


def suggest_lrs(lrs: list[float], smoothed: list[float]) -> dict[str, float]:
    """``valley``, ``steepest`` and ``minimum`` suggestions from a sweep (rules in the module docstring)."""
    lrs_arr, losses = _trimmed(np.asarray(lrs, dtype=float), np.asarray(smoothed, dtype=float))
    if len(losses) < 2:
        raise ValueError(
            f"lr_find: only {len(losses)} usable points in the sweep of {len(lrs)} batches (the loss was "
            "non-finite or diverged early, or the batches have no targets); lower start_lr or raise num_it"
        )
    slopes = np.gradient(losses, np.log(lrs_arr))
    return {
        "valley": float(lrs_arr[_valley_index(losses)]),
        "steepest": float(lrs_arr[int(np.argmin(slopes))]),
        "minimum": float(lrs_arr[int(np.argmin(losses))] / 10),
    }


def find_lr(
    learn: Learner,
    start_lr: float = 1e-7,
    end_lr: float = 10.0,
    num_it: int = 100,
    stop_div: bool = True,
    show_plot: bool = False,
) -> LRFindResult:
    """Run an LR sweep on ``learn`` and return its result; the learner is left as it was before."""
    require_batches(learn.dls.train, "Learner.lr_find")
    if learn.opt is None:
        learn.create_opt()
    finder = LRFinder(start_lr, end_lr, num_it, stop_div)
    snapshot = _Snapshot(learn)
    # a companion leaves and comes back with its owner (remove_cb/add_cb take it along)
    companions = {id(companion) for cb in learn.cbs for companion in cb.companions}
    detached = [cb for cb in learn.cbs if sits_out_sweeps(cb) and id(cb) not in companions]
    try:
        for cb in detached:
            learn.remove_cb(cb)
        learn.fit(math.ceil(num_it / len(learn.dls.train)), cbs=[finder])
    finally:
        learn.add_cbs(detached)
        learn.cbs.sort(key=snapshot.cb_order.index)
        snapshot.restore(learn)
    result = finder.result()
    if show_plot:
        _show(result)
    return result


class _Snapshot:
    """What a sweep changes and must give back: weights and gradients (a sweep can stop in the middle of
    an accumulation group), optimizer and loss-scaler state, step count, and every RNG the run draws
    from (python, numpy, torch, the loaders' generators): a fit after ``lr_find`` shuffles as without it."""

    def __init__(self, learn: Learner) -> None:
        self.cb_order = list(learn.cbs)
        scalers = [cb for cb in learn.cbs if isinstance(cb, MixedPrecision)]
        self.precision = [(cb, copy.deepcopy(cb.state_dict())) for cb in scalers]
        self.model = {k: v.detach().clone() for k, v in learn.model.state_dict().items()}
        self.grads = [None if p.grad is None else p.grad.clone() for p in learn.model.parameters()]
        self.opt = copy.deepcopy(learn.opt.state_dict())
        self.training_step = learn.training_step
        self.generators = rng_generators(learn)
        self.rng = capture_rng(self.generators)

    def restore(self, learn: Learner) -> None:
        learn.model.load_state_dict(self.model)
        for param, grad in zip(learn.model.parameters(), self.grads, strict=True):
            param.grad = grad
        learn.opt.load_state_dict(self.opt)
        learn.training_step = self.training_step
        for cb, state in self.precision:
            cb.load_state_dict(state)
        restore_rng(self.rng, self.generators)


def _trimmed(lrs: np.ndarray, losses: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drop the first 10% (the average is still warming up), the last 5 points (the blow-up) and
    everything from the first non-finite loss on."""
    bad = np.flatnonzero(~np.isfinite(losses))
    stop = bad[0] if len(bad) else len(losses)
    start = len(losses) // 10
    end = stop - 5 if stop - 5 - start >= 2 else stop
    return lrs[start:end], losses[start:end]


def _valley_index(losses: np.ndarray) -> int:
    """Index halfway down the longest decreasing run (longest decreasing subsequence ending anywhere)."""
    n = len(losses)
    run = [1] * n
    for i in range(1, n):
        for j in range(i):
            if losses[i] < losses[j]:
                run[i] = max(run[i], run[j] + 1)
    end = int(np.argmax(run))
    start = end - run[end] + 1
    return start + (end - start) // 2


def _show(result: LRFindResult) -> None:
    # pyplot (and its GUI backend) only when the user asked to see the plot.
    import matplotlib.pyplot as plt

    _, ax = plt.subplots(figsize=(6, 4))
    result.plot(ax)
    plt.show()
