"""Training curves from the Recorder: losses and metrics over the run, and the learning-rate schedule.

Both take plain sequences (``learn.recorder.losses``, ``.lrs``, ``.history``), so they draw a live learner
and a finished run alike, and return a ``matplotlib.figure.Figure`` built without pyplot.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure

_NOT_METRICS = ("epoch", "train_loss", "valid_loss", "time")


def loss_curves(losses: Sequence[float], history: Sequence[Mapping[str, Any]]) -> Figure:
    """Training loss per step (raw and smoothed), train/valid loss per epoch, and the metrics per epoch.

    Epoch values are drawn at the step where each epoch ended (epochs are assumed equally long). The
    metrics panel is left out when the run had no metric.
    """
    if not losses and not history:
        raise ValueError("loss_curves: nothing recorded yet; train first (learn.recorder.losses is empty)")
    metrics = [k for k in (history[0] if history else {}) if k not in _NOT_METRICS]
    from matplotlib.figure import Figure  # matplotlib loads when a figure is drawn

    fig = Figure(figsize=(10, 3.8) if metrics else (6, 3.8))
    axes = fig.subplots(1, 2 if metrics else 1, squeeze=False)[0]
    steps = np.arange(1, len(losses) + 1)
    epoch_steps = [len(losses) * (i + 1) / len(history) for i in range(len(history))]
    ax = axes[0]
    if len(losses):
        ax.plot(steps, losses, color="#9db4d8", linewidth=1, label="train (step)")
        ax.plot(steps, _smooth(losses), color="#2f6fde", linewidth=2, label="train (smoothed)")
    for key, style in (("train_loss", "o-"), ("valid_loss", "s-")):
        values = [row.get(key, math.nan) for row in history]
        if any(math.isfinite(v) for v in values):
            ax.plot(epoch_steps, values, style, linewidth=1.5, label=f"{key.replace('_', ' ')} (epoch)")
    ax.set_yscale("log" if _spans_decades(losses) else "linear")
    ax.set_xlabel("training step")
    ax.set_ylabel("loss")
    ax.set_title("loss")
    ax.legend(fontsize="small")
    if metrics:
        for key in metrics:
            axes[1].plot(
                range(1, len(history) + 1), [row.get(key, math.nan) for row in history], "o-", label=key
            )
        axes[1].set_xlabel("epoch")
        axes[1].set_title("validation metrics")
        axes[1].legend(fontsize="small")
        axes[1].set_xticks(range(1, len(history) + 1))
    for a in axes:
        a.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def lr_schedule(lrs: Sequence[float]) -> Figure:
    """The learning rate of the first parameter group at every training step."""
    if not lrs:
        raise ValueError(
            "lr_schedule: no learning rate recorded yet; train first (learn.recorder.lrs is empty)"
        )
    from matplotlib.figure import Figure  # matplotlib loads when a figure is drawn

    fig = Figure(figsize=(6, 3.2))
    ax = fig.add_subplot()
    ax.plot(np.arange(1, len(lrs) + 1), lrs, color="#2f6fde", linewidth=2)
    ax.set_xlabel("training step")
    ax.set_ylabel("learning rate")
    ax.set_title(f"learning rate (peak {max(lrs):.3g})")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def _smooth(values: Sequence[float], beta: float = 0.9) -> np.ndarray:
    """Debiased exponential moving average, as fastai's smoothed loss."""
    out, avg = np.empty(len(values)), 0.0
    for i, value in enumerate(values):
        avg = beta * avg + (1 - beta) * value
        out[i] = avg / (1 - beta ** (i + 1))
    return out


def _spans_decades(values: Sequence[float]) -> bool:
    """A log axis only helps when the loss fell by more than 10×; else it just makes odd tick labels."""
    finite = [v for v in values if math.isfinite(v)]
    return bool(finite) and min(finite) > 0 and max(finite) / min(finite) > 10
