"""``hs.compare_runs(a, b)`` and ``hookscope compare RUN_A RUN_B``: two run folders on one page.

The page, ``compare.html``, is self-contained like ``report.html`` (figures, style sheet and chart script
inline, no network): where the runs part and the evidence for it, their config differences, their metric
curves overlaid, every layer's first parting step per kind of statistic with both runs' series as
interactive charts (hover, zoom, a layer filter), and each run's findings. What "part" means is in
:mod:`hookscope.viz.run_diff`.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hookscope.atomic import atomic_write_text
from hookscope.viz.charts import Series, chart_html, layer_filter_html, page_head, preselect, rows_series
from hookscope.viz.page import (
    figure_html,
    finding_layer,
    format_value,
    page_html,
    png_bytes,
    section_html,
    severity_badge,
    table_html,
)
from hookscope.viz.run_diff import NOISE_MULTIPLE, Parting, RunComparison, RunData, diff_runs, read_run

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PAGE = "compare.html"
COLORS = ("#2f6fde", "#e0582b")  # run A, run B


def compare_runs(a: str | Path, b: str | Path, out: str | Path | None = None) -> RunComparison:
    """Compare the run folders ``a`` and ``b``; with ``out``, also write ``out/compare.html``.

    Returns the :class:`~hookscope.viz.run_diff.RunComparison`: ``str()`` of it says where the runs part,
    ``.first`` is the earliest parting (step, layer, statistic), ``.identical`` whether nothing differs,
    ``.page`` the page written.
    """
    comparison = diff_runs(read_run(a), read_run(b))
    if out is not None:
        comparison.page = write_compare_page(comparison, out)
    return comparison


def write_compare_page(comparison: RunComparison, out: str | Path) -> Path:
    """Write ``out/compare.html`` for ``comparison`` and return its path."""
    a, b = comparison.a, comparison.b
    body = [
        _header(comparison),
        section_html("Where they part", _PARTING_LEAD, _parting_body(comparison)),
        section_html("Configuration differences", "", _config_body(comparison)),
        section_html("Metric curves", "Run A solid, run B dashed.", _metrics_body(a, b)),
        section_html("Per-layer statistics", _LAYERS_LEAD, _layers_body(comparison)),
        section_html("Findings", "What the doctor found in each run.", _findings_body(a, b)),
    ]
    page = page_html(f"hookscope: {a.name} vs {b.name}", "\n".join(body), head=page_head())
    return atomic_write_text(Path(out) / PAGE, page)


_PARTING_LEAD = (
    f"A statistic parts when the runs differ by more than {NOISE_MULTIPLE:g} times its step-to-step noise "
    "(the median change between consecutive records within a run, the larger of the two)."
)
_LAYERS_LEAD = (
    "The first recorded step where each layer's statistic parts beyond noise (— : it never does). From the "
    "doctor's history in history.json (in older run folders, checkpoints/last.pt)."
)


def _header(comparison: RunComparison) -> str:
    a, b = comparison.a, comparison.b
    verdict = "identical" if comparison.identical else "parted" if comparison.first else "close"
    return (
        f"<header><h1>hookscope compare: <code>{html.escape(a.name)}</code> vs "
        f"<code>{html.escape(b.name)}</code></h1>"
        f"<p>A: <code>{html.escape(str(a.path))}</code> · B: <code>{html.escape(str(b.path))}</code></p>"
        f'<p id="verdict" class="verdict-{verdict}">{html.escape(comparison.verdict())}</p></header>'
    )


def _parting_body(comparison: RunComparison) -> str:
    firsts = _first_per_kind(comparison.partings)
    if not firsts:
        return '<p class="note">No per-layer statistic parts beyond its noise.</p>'
    rows = [
        [
            html.escape(p.kind),
            f"<code>{html.escape(p.layer)}</code>",
            html.escape(p.stat or "—"),
            html.escape(format_value(p.step)),
            html.escape(format_value(p.a)),
            html.escape(format_value(p.b)),
            html.escape(format_value(p.noise)),
        ]
        for p in firsts
    ]
    table = table_html(
        ["kind", "layer", "statistic", "step", "A", "B", "noise"], rows, {3, 4, 5, 6}, "parting"
    )
    return table + figure_html(
        png_bytes(_parting_figure(comparison, firsts)), "The first parting series of each kind"
    )


def _config_body(comparison: RunComparison) -> str:
    if not comparison.config_diff:
        return '<p class="note">The same config (names, paths and times aside).</p>'
    rows = [
        [f"<code>{html.escape(k)}</code>", html.escape(format_value(va)), html.escape(format_value(vb))]
        for k, va, vb in comparison.config_diff
    ]
    return table_html(["option", "A", "B"], rows, set(), "config")


def _metrics_body(a: RunData, b: RunData) -> str:
    if not a.metrics and not b.metrics:
        return '<p class="note">Neither run wrote metrics.jsonl.</p>'
    last = [_last_epoch(a.metrics), _last_epoch(b.metrics)]
    keys = [k for k in dict.fromkeys([*last[0], *last[1]]) if k not in ("kind", "time")]
    rows = [
        [html.escape(k), html.escape(format_value(last[0].get(k))), html.escape(format_value(last[1].get(k)))]
        for k in keys
    ]
    table = table_html(["last epoch", "A", "B"], rows, {1, 2}, "metrics")
    return _metric_charts(a, b) + table


def _layers_body(comparison: RunComparison) -> str:
    a, b = comparison.a, comparison.b
    if not a.layers or not b.layers:
        why = a.layers_note or b.layers_note or "the runs recorded different layers"
        return f'<p class="note">No per-layer statistics to compare: {html.escape(why)}.</p>'
    kinds = [k for k in a.layers if k in b.layers]
    first: dict[tuple[str, str], int] = {}
    for p in comparison.partings:
        first.setdefault((p.kind, p.layer), p.step)
    layers = list(dict.fromkeys(layer for kind in kinds for layer, _ in a.layers[kind]))
    rows = [
        [f"<code>{html.escape(layer)}</code>"]
        + [
            html.escape(format_value(first.get((kind, layer)))) if (kind, layer) in first else "—"
            for kind in kinds
        ]
        for layer in layers
    ]
    table = table_html(["layer", *kinds], rows, set(range(1, len(kinds) + 1)), "layers")
    return table + _layer_charts(comparison, kinds)


def _findings_body(a: RunData, b: RunData) -> str:
    parts = []
    for label, run, other in (("A", a, b), ("B", b, a)):
        title = f"<h3>Run {label}: <code>{html.escape(run.name)}</code></h3>"
        if run.findings is None:
            parts.append(title + '<p class="note">The doctor was off for this run.</p>')
            continue
        theirs = {(f.get("kind"), f.get("module")) for f in other.findings or []}
        rows = [
            [
                severity_badge(f),
                html.escape(str(f.get("kind", ""))),
                f"<code>{html.escape(str(finding_layer(f)))}</code>",
                html.escape(format_value(f.get("step"))),
                ("" if (f.get("kind"), f.get("module")) in theirs else "<b>only here</b> ")
                + html.escape(str(f.get("message", ""))),
            ]
            for f in run.findings
        ]
        if not rows:
            rows = [['<span class="sev sev-ok">ok</span>', "", "", "", "No problem found."]]
        table = table_html(["severity", "kind", "layer", "step", "message"], rows, {3}, f"findings-{label}")
        parts.append(title + table)
    return "".join(parts)


# ------------------------------------------------------------------------------------------------ figures


def _metric_charts(a: RunData, b: RunData) -> str:
    """The loss (per logged step, and validation per epoch) and the metrics per epoch of both runs."""
    metrics = [k for k in dict.fromkeys(k for r in [*a.metrics, *b.metrics] for k in r) if _is_metric(k)]
    losses, others = [], []
    for label, run, color in (("A", a, COLORS[0]), ("B", b, COLORS[1])):
        style = {"color": color, "dash": run is b}
        steps = [r for r in run.metrics if r.get("kind") == "step"]
        epochs = [r for r in run.metrics if r.get("kind") == "epoch"]
        losses.append(rows_series(f"{label} train", steps, "train_loss", **style))
        losses.append(rows_series(f"{label} valid", epochs, "valid_loss", markers=True, **style))
        others += [rows_series(f"{label} {key}", epochs, key, markers=True, **style) for key in metrics]
    charts = chart_html("Loss", [s for s in losses if s.steps], y_label="loss")
    if any(s.steps for s in others):
        charts += chart_html("Metrics per epoch", [s for s in others if s.steps], y_label="metric", log=False)
    return charts


def _layer_charts(comparison: RunComparison, kinds: list[str]) -> str:
    """Both runs' series of every layer, one chart per kind and statistic, under one layer filter (the
    layers that part first are ticked)."""
    a, b = comparison.a, comparison.b
    layers = list(dict.fromkeys(layer for k in kinds for layer, _ in a.layers[k]))
    parting = [p.layer for p in comparison.partings]
    charts = layer_filter_html("compare", layers, preselect(layers, parting))
    for kind in kinds:
        for stat in dict.fromkeys(stat for _, stat in a.layers[kind]):
            series = [
                Series(
                    f"{label}: {key[0]}",
                    run.layers[kind][key].steps,
                    run.layers[kind][key].values,
                    layer=key[0],
                    dash=run is b,
                )
                for key in a.layers[kind]
                if key[1] == stat and key in b.layers[kind]
                for label, run in (("A", a), ("B", b))
            ]
            title = f"{kind} {stat}".strip()
            charts += chart_html(title[0].upper() + title[1:], series, y_label=stat or kind, group="compare")
    return charts


def _parting_figure(comparison: RunComparison, firsts: list[Parting]) -> Figure:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.2 * len(firsts), 3.4))
    axes = fig.subplots(1, len(firsts), squeeze=False)[0]
    for ax, parting in zip(axes, firsts, strict=True):
        key = (parting.layer, parting.stat)
        for run, color in zip((comparison.a, comparison.b), COLORS, strict=True):
            series = run.layers[parting.kind][key]
            ax.plot(
                series.steps, series.values, "-" if run is comparison.a else "--", color=color, label=run.name
            )
        series_a = comparison.a.layers[parting.kind][key]
        band = NOISE_MULTIPLE * parting.noise
        low, high = [v - band for v in series_a.values], [v + band for v in series_a.values]
        label = f"A ± {NOISE_MULTIPLE:g}× noise"
        ax.fill_between(series_a.steps, low, high, color=COLORS[0], alpha=0.15, linewidth=0, label=label)
        ax.axvline(parting.step, color="#c62828", linestyle=":", linewidth=1.2)
        ax.set_title(
            f"{parting.kind} {parting.stat}\n{parting.layer} (parts at step {parting.step})", fontsize=9
        )
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------------------------ helpers


def _first_per_kind(partings: list[Parting]) -> list[Parting]:
    firsts: dict[str, Parting] = {}
    for p in partings:
        firsts.setdefault(p.kind, p)
    return list(firsts.values())


def _last_epoch(rows: list[dict[str, Any]]) -> dict[str, Any]:
    epochs = [r for r in rows if r.get("kind") == "epoch"]
    return epochs[-1] if epochs else {}


def _is_metric(key: str) -> bool:
    return key not in ("kind", "epoch", "step", "time", "lr", "train_loss", "valid_loss")
