"""The per-layer difference of two models (:func:`hookscope.compare`) as one figure.

Modules run left to right in execution order; the y axis is the largest difference relative to model_a's
scale, on a log scale, for the outputs and (when a loss was given) the output gradients. The first divergent
module is marked: everything to its right that differs only inherited the difference.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from hookscope.hooks.compare import Comparison

if TYPE_CHECKING:
    from matplotlib.figure import Figure

FLOOR = 1e-12  # where an exact match is drawn on the log axis


def comparison_plot(comparison: Comparison) -> Figure:
    """Relative difference per module (outputs, and output gradients when compared), execution order.

    Exact matches sit on the floor line (``1e-12``); modules whose shapes differ are marked with an ``x``
    at the top; the dashed line is ``rtol``, the red band the first divergent module.
    """
    from matplotlib.figure import Figure  # matplotlib loads when a figure is drawn

    rows = comparison.layers
    labels = [row.name + (f" ({row.call})" if row.call else "") for row in rows]
    x = np.arange(len(rows))
    fig = Figure(figsize=(max(7.0, 0.28 * len(rows) + 2), 4.2))
    ax = fig.add_subplot()
    outputs = _values([row.max_rel for row in rows])
    ax.plot(x, outputs, marker="o", markersize=3, label="output")
    grads = [row.grad_max_rel for row in rows]
    if any(g is not None for g in grads):
        ax.plot(x, _values(grads), marker="s", markersize=3, label="gradient w.r.t. output")
    broken = [i for i, row in enumerate(rows) if row.note and row.max_rel is None]
    if broken:
        top = max(float(np.nanmax(outputs)), comparison.rtol) * 10
        ax.plot(broken, [top] * len(broken), "x", color="black", label="not comparable (shape)")
    ax.axhline(comparison.rtol, color="gray", linestyle="--", linewidth=1, label=f"rtol {comparison.rtol:g}")
    if comparison.first_divergent is not None:
        first = next(i for i, row in enumerate(rows) if row.name == comparison.first_divergent)
        ax.axvspan(first - 0.5, first + 0.5, color="#c62828", alpha=0.18, label="first divergent")
    ax.set_yscale("log")
    ax.set_ylabel("max |a - b| / max |a|")
    ax.set_xticks(x, labels, rotation=90, fontsize=7)
    ax.set_title(_title(comparison), fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


def _values(values: list[float | None]) -> np.ndarray:
    """Relative differences ready for a log axis: 0 on the floor, missing as a gap."""
    return np.array([np.nan if v is None else max(v, FLOOR) for v in values], dtype=np.float64)


def _title(comparison: Comparison) -> str:
    if comparison.first_divergent is None:
        return "The models agree within tolerance"
    return f"First divergent: {comparison.first_divergent} ({comparison.phase})"
