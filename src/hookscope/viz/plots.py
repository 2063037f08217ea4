"""Training-statistics plots: the colorful dimension, activation curves and gradient flow.

Each function takes what :class:`~hookscope.callbacks.ActivationStats`,
:class:`~hookscope.callbacks.GradientStats` or the Doctor (``learn.doctor.activations`` / ``.gradients``)
recorded (the callback or recorder itself, or its ``history`` / ``param_history`` mapping) and returns a
``matplotlib.figure.Figure`` built without pyplot; save it with :func:`hookscope.viz.save_figure`.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

from hookscope.doctor.record_types import ParamRecord, StepStats

History = Mapping[str, Sequence[StepStats]]
ParamHistory = Mapping[str, Sequence[ParamRecord]]


class Recorded(Protocol):
    """What recorded layer statistics: a statistics callback or a recorder (the Doctor's)."""

    @property
    def history(self) -> History: ...


class RecordedParams(Protocol):
    """What recorded parameter statistics: ``GradientStats`` or the Doctor's gradient recorder."""

    @property
    def param_history(self) -> ParamHistory: ...


def colorful_dimension(
    history: Recorded | History,
    layer: str,
    *,
    log: bool = True,
    cmap: str = "viridis",
) -> Figure:
    """The histogram of ``layer`` at every recorded step as one image: steps left to right, values up.

    Each column is one step's histogram (``log1p`` of the counts when ``log``, so rare values stay
    visible); a healthy layer shows a smooth band, a collapsing one a bright line at 0.
    """
    records = _layer_records(_history(history), layer, "colorful_dimension")
    counts = np.stack([r.stats.histogram for r in records], axis=1).astype(np.float64)
    edges = records[0].stats.edges
    steps = [r.step for r in records]
    from matplotlib.figure import Figure  # matplotlib loads when a figure is drawn

    fig = Figure(figsize=(8, 3.5))
    ax = fig.add_subplot()
    image = ax.imshow(
        np.log1p(counts) if log else counts,
        origin="lower",
        aspect="auto",
        cmap=cmap,
        extent=(steps[0] - 0.5, steps[-1] + 0.5, float(edges[0]), float(edges[-1])),
        interpolation="nearest",
    )
    fig.colorbar(image, ax=ax, label="log(1 + count)" if log else "count")
    ax.set_title(f"{layer}: histogram per step")
    ax.set_xlabel("training step")
    ax.set_ylabel("value")
    fig.tight_layout()
    return fig


def activation_curves(
    history: Recorded | History,
    layers: Sequence[str] | None = None,
    *,
    dead_threshold: float = 0.0,
) -> Figure:
    """Per-layer mean, standard deviation and dead-unit fraction over the recorded steps (three panels).

    ``layers`` picks some (default: all recorded); a unit is dead over a step when its max |x| stayed at
    or below ``dead_threshold``.
    """
    records = _history(history)
    names = list(layers) if layers is not None else [n for n, r in records.items() if r]
    from matplotlib.figure import Figure  # matplotlib loads when a figure is drawn

    fig = Figure(figsize=(8, 7))
    ax_mean, ax_std, ax_dead = fig.subplots(3, 1, sharex=True)
    positive_std = False
    for name in names:
        layer = _layer_records(records, name, "activation_curves")
        steps = [r.step for r in layer]
        stds = [r.stats.std for r in layer]
        positive_std = positive_std or any(s > 0 for s in stds)
        ax_mean.plot(steps, [r.stats.mean for r in layer], label=name)
        ax_std.plot(steps, stds, label=name)
        ax_dead.plot(steps, [r.stats.dead_fraction(dead_threshold) for r in layer], label=name)
    ax_mean.set_ylabel("mean")
    ax_std.set_ylabel("std")
    if positive_std:  # stds span decades across layers; a log axis needs a positive value
        ax_std.set_yscale("log")
    ax_dead.set_ylabel("dead fraction")
    ax_dead.set_ylim(-0.05, 1.05)
    ax_dead.set_xlabel("training step")
    if len(names) <= 12:
        ax_mean.legend(fontsize="small", loc="best")
    fig.tight_layout()
    return fig


def gradient_flow(grad_stats: RecordedParams | ParamHistory) -> Figure:
    """Gradient norm per layer, in model order: median over the recorded steps (bar), range (line), last
    step (dot); a second panel shows the update-to-weight ratio when it was recorded.

    A layer's norm combines its parameters (``sqrt(sum of squared norms)``); its update ratio is the
    largest of its parameters'. A layer that never got a gradient is marked "no grad".
    """
    params = grad_stats if isinstance(grad_stats, Mapping) else grad_stats.param_history
    if not any(params.values()):
        raise ValueError(
            "gradient_flow: no gradient records yet; train with hs.callbacks.GradientStats() first"
        )
    layers = _group_by_layer(params)
    norms = {layer: _layer_norms(records) for layer, records in layers.items()}
    ratios = {layer: _layer_ratios(records) for layer, records in layers.items()}
    with_ratios = any(len(r) for r in ratios.values())
    from matplotlib.figure import Figure  # matplotlib loads when a figure is drawn

    fig = Figure(figsize=(max(6.0, 0.5 * len(layers) + 2), 6.5 if with_ratios else 4.0))
    axes = fig.subplots(2 if with_ratios else 1, 1, sharex=True, squeeze=False)[:, 0]
    _draw_flow(axes[0], norms, "gradient norm")
    if with_ratios:
        _draw_flow(axes[1], ratios, "update / weight")
        axes[1].axhline(1e-3, color="gray", linestyle="--", linewidth=1)
    axes[-1].set_xticks(range(len(layers)), list(layers), rotation=60, ha="right", fontsize="small")
    axes[0].set_title("gradient flow")
    fig.tight_layout()
    return fig


def _draw_flow(ax: Axes, values: dict[str, np.ndarray], label: str) -> None:
    for x, series in enumerate(values.values()):
        finite = series[np.isfinite(series) & (series > 0)]
        if finite.size == 0:
            ax.annotate("no grad", (x, 0.02), xycoords=("data", "axes fraction"), rotation=90, ha="center")
            continue
        ax.bar(x, float(np.median(finite)), color="tab:blue", alpha=0.6)
        ax.vlines(x, finite.min(), finite.max(), color="black", linewidth=1)
        ax.plot(x, series[-1], "o", color="tab:red", markersize=4)
    ax.set_yscale("log")
    ax.set_ylabel(label)


# Beyond this many layers, gradient_flow draws one bar per block (``transformer.h.3`` for every layer
# under it, combined as a layer's parameters are), so a deep model's figure stays readable (GPT-2 small:
# 75 layers with parameters, 12 blocks).
MAX_FLOW_LAYERS = 40


def _group_by_layer(params: ParamHistory) -> dict[str, list[Sequence[ParamRecord]]]:
    """The parameters' records per layer, or per block when there are more than ``MAX_FLOW_LAYERS``."""
    layers: dict[str, list[Sequence[ParamRecord]]] = {}
    for name, records in params.items():
        layer = name.rpartition(".")[0] or "(model)"
        layers.setdefault(layer, []).append(records)
    if len(layers) <= MAX_FLOW_LAYERS:
        return layers
    blocks: dict[str, list[Sequence[ParamRecord]]] = {}
    for layer, records in layers.items():
        blocks.setdefault(_block_of(layer), []).extend(records)
    return blocks


def _block_of(layer: str) -> str:
    """The repeated block a layer is in: its name up to the first index (``transformer.h.3.mlp.c_fc``
    -> ``transformer.h.3``); the layer itself outside numbered containers (``transformer.wte``)."""
    parts = layer.split(".")
    index = next((i for i, part in enumerate(parts) if part.isdigit()), None)
    return layer if index is None else ".".join(parts[: index + 1])


def _layer_norms(param_records: list[Sequence[ParamRecord]]) -> np.ndarray:
    """Per step: sqrt of the sum of squared parameter norms; nan where no parameter got a gradient."""
    by_step: dict[int, float] = {}
    for records in param_records:
        for r in records:
            if r.grad_norm is not None:
                by_step[r.step] = by_step.get(r.step, 0.0) + r.grad_norm**2
    steps = sorted({r.step for records in param_records for r in records})
    return np.array([math.sqrt(by_step[s]) if s in by_step else math.nan for s in steps])


def _layer_ratios(param_records: list[Sequence[ParamRecord]]) -> np.ndarray:
    by_step: dict[int, float] = {}
    for records in param_records:
        for r in records:
            if r.update_ratio is not None:
                by_step[r.step] = max(by_step.get(r.step, 0.0), r.update_ratio)
    return np.array([by_step[s] for s in sorted(by_step)])


def _history(source: Recorded | History) -> History:
    return source if isinstance(source, Mapping) else source.history


def _layer_records(history: History, layer: str, who: str) -> Sequence[StepStats]:
    if layer not in history:
        close = difflib.get_close_matches(layer, list(history), n=5, cutoff=0.3)
        hint = f"; closest: {', '.join(close)}" if close else f"; recorded: {', '.join(list(history)[:10])}"
        raise KeyError(f"{who}: no layer {layer!r} in the history{hint}")
    records = history[layer]
    if not records:
        raise ValueError(
            f"{who}: layer {layer!r} has no records yet; train with the stats callback before plotting"
        )
    return records
