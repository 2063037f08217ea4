"""The interactive charts of report.html, from a run folder's ``metrics.jsonl`` and ``history.json``.

Each chart stands for the PNG figure of the same data (its file-name stem in ``replaces``), which the report
then leaves out; figures with no data behind a chart (feature maps, colorful dimension, the gradient-flow
overview) stay images. The per-layer charts of one section share a layer filter with a few layers ticked
(those a finding names, then layers spread over the model's depth); every other layer is one tick away.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hookscope.viz.charts import Series, chart_html, layer_filter_html, preselect, rows_series

_NOT_METRICS = ("kind", "epoch", "step", "time", "lr", "train_loss", "valid_loss")


@dataclass(frozen=True)
class SectionCharts:
    """The charts of one report section and the figure stems they replace."""

    html: str
    replaces: tuple[str, ...]


def report_charts(
    history: dict[str, Any], rows: list[dict[str, Any]], findings: list[dict[str, Any]]
) -> dict[str, SectionCharts]:
    """Section title -> its charts, for the sections there is data for. ``history``: history.json's
    content; ``rows``: metrics.jsonl's; ``findings``: findings.json's (their layers are ticked first)."""
    named = [str(f.get("module") or "") for f in findings]
    charts: dict[str, SectionCharts] = {}
    curves = _training_curves(history, rows)
    if curves:
        charts["Training curves"] = SectionCharts(curves, ("loss",))
    lr = history.get("lr")
    if lr:
        chart = chart_html("Learning rate", [Series("lr", lr["step"], lr["value"])], y_label="learning rate")
        charts["Learning-rate schedule"] = SectionCharts(chart, ("lr",))
    activations = history.get("activations")
    if activations:
        stats = (("mean", "Mean", False), ("std", "Standard deviation", None), ("dead", "Dead units", False))
        html = _layer_charts("activations", activations, stats, named)
        charts["Activations"] = SectionCharts(html, ("activations",))  # activations.png's three panels
    gradients = history.get("gradients")
    if gradients:
        stats = (("norm", "Gradient norm", None), ("ratio", "Update / weight ratio", None))
        charts["Gradient flow"] = SectionCharts(_layer_charts("gradients", gradients, stats, named), ())
    return charts


def _training_curves(history: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """The loss per step and per epoch, and the metrics per epoch (two charts), or "" without data."""
    steps = [r for r in rows if r.get("kind") == "step"]
    epochs = [r for r in rows if r.get("kind") == "epoch"]
    loss = history.get("loss")
    lines = (
        [Series("train (step)", loss["step"], loss["value"], color="#9db4d8")]
        if loss
        else [rows_series("train (step)", steps, "train_loss", color="#9db4d8")]
    )
    for key, color in (("train_loss", "#2f6fde"), ("valid_loss", "#e0582b")):
        lines.append(rows_series(f"{key.replace('_', ' ')} (epoch)", epochs, key, color=color, markers=True))
    lines = [s for s in lines if len(s.steps)]
    if not lines:
        return ""
    html = chart_html("Loss", lines, y_label="loss")
    metrics = [k for k in dict.fromkeys(k for r in epochs for k in r) if k not in _NOT_METRICS]
    if metrics:
        numbered = [{**r, "n": r.get("epoch", i) + 1} for i, r in enumerate(epochs)]
        series = [rows_series(key, numbered, key, x="n", markers=True) for key in metrics]
        html += chart_html("Validation metrics", series, x_label="epoch", y_label="metric", log=False)
    return html


def _layer_charts(
    group: str,
    layers: dict[str, dict[str, list]],
    stats: tuple[tuple[str, str, bool | None], ...],
    named: list[str],
) -> str:
    """One layer filter and one chart per statistic, a line per layer."""
    names = list(layers)
    html = layer_filter_html(group, names, preselect(names, named))
    for key, title, log in stats:
        series = [Series(layer, c["step"], c[key], layer=layer) for layer, c in layers.items() if key in c]
        fraction = (0.0, 1.0) if key == "dead" else None  # a fraction of units: the whole range
        html += chart_html(title, series, y_label=key, group=group, log=log, y_range=fraction)
    return html
