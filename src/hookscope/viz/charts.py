"""Interactive line charts for the report pages: the HTML and inline JSON of one chart, and the script.

The pages stay one self-contained file: the chart library (``static/charts.js``, ours, no dependency) and
its style sheet are inlined by :func:`page_head`, and each chart carries its data as inline JSON. A reader
hovers a line for the step and value, drags across a plot to zoom on x, and ticks layers in a filter shared
by the charts of one ``group``. A chart keeps at most :data:`CHART_VALUES` values (each series at most
``MAX_POINTS`` points, at least ``MIN_POINTS``), so a page stays a few MB on a model of hundreds of layers;
see docs/report.md for the sizes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from hookscope.run_history import MAX_POINTS, keep

CHART_VALUES = 30_000  # values one chart carries at most: its series share them
MIN_POINTS = 100  # points a series keeps however many series share a chart
PRESELECTED = 8  # layers ticked in a layer filter when the page opens


@dataclass(frozen=True)
class Series:
    """One line: ``values`` at ``steps`` (ascending). ``layer`` ties it to a layer filter; ``color``
    (CSS) overrides the palette; ``dash`` draws it dashed, ``markers`` marks each point."""

    name: str
    steps: Sequence[float]
    values: Sequence[float]
    layer: str | None = None
    color: str | None = None
    dash: bool = False
    markers: bool = False


@cache
def page_head() -> str:
    """The ``<style>`` and ``<script>`` every page with charts carries in its head (package data)."""
    static = resources.files("hookscope.viz") / "static"
    style = (static / "charts.css").read_text(encoding="utf-8")
    script = (static / "charts.js").read_text(encoding="utf-8")
    return f"<style>{style}</style>\n<script>{script}</script>\n"


def chart_html(
    title: str,
    series: Sequence[Series],
    *,
    x_label: str = "training step",
    y_label: str = "",
    group: str | None = None,
    log: bool | None = None,
    y_range: tuple[float, float] | None = None,
    max_points: int | None = None,
) -> str:
    """One chart of ``series``; ``group`` names the layer filter it follows (see :func:`layer_filter_html`).

    ``log`` picks a log y axis; None: log when every value is positive and they span more than 10×.
    ``y_range``: a fixed y axis (a fraction: ``(0, 1)``); None: the values' range, padded.
    ``max_points``: the points a series keeps (None: its share of :data:`CHART_VALUES`).
    """
    if max_points is None:
        max_points = min(MAX_POINTS, max(MIN_POINTS, CHART_VALUES // max(len(series), 1)))
    xs: list[list[float]] = []
    lines = []
    for s in series:
        steps, values = thin(s.steps, s.values, max_points)
        steps = [_number(x) for x in steps]
        if steps not in xs:  # series recorded at the same steps share one x array
            xs.append(steps)
        line: dict[str, Any] = {"name": s.name, "x": xs.index(steps), "y": [_number(v) for v in values]}
        extras = {"layer": s.layer, "color": s.color, "dash": s.dash, "markers": s.markers}
        lines.append(line | {k: v for k, v in extras.items() if v})
    spec = {
        "title": title,
        "x_label": x_label,
        "y_label": y_label,
        "log": spans_decades([v for s in series for v in s.values]) if log is None else log,
        "group": group,
        "y_range": y_range,
        "xs": xs,
        "series": lines,
    }
    return f'<div class="hs-chart">{_json_script(spec)}</div>'


def rows_series(name: str, rows: Sequence[dict[str, Any]], key: str, x: str = "step", **style: Any) -> Series:
    """The series of ``key`` against ``x`` in metric rows (metrics.jsonl's), over the rows that have a
    number for both; ``style``: :class:`Series` fields (``color``, ``dash``, ``markers``)."""
    points = [(r[x], r[key]) for r in rows if _is_number(r.get(key)) and _is_number(r.get(x))]
    return Series(name, [p[0] for p in points], [p[1] for p in points], **style)


def layer_filter_html(group: str, layers: Sequence[str], shown: Iterable[str]) -> str:
    """The layer filter of the charts of ``group``: a tick box per layer of ``layers`` (in model order),
    ``shown`` ticked when the page opens."""
    spec = {"group": group, "layers": list(layers), "shown": [layer for layer in shown if layer in layers]}
    return f'<div class="hs-filter">{_json_script(spec)}</div>'


def preselect(layers: Sequence[str], first: Iterable[str] = (), k: int = PRESELECTED) -> list[str]:
    """The ``k`` layers a filter ticks at first: up to half of them from ``first`` (the layers findings
    or partings name, most important first), the rest spread evenly over the depth of the model, so the
    first, middle and last blocks show too."""
    chosen = list(dict.fromkeys(layer for layer in first if layer in layers))[: max(k // 2, 1)]
    others = [layer for layer in layers if layer not in chosen]
    n = min(k - len(chosen), len(others))
    return chosen + [others[round(i * (len(others) - 1) / max(n - 1, 1))] for i in range(n)]


def thin(steps: Sequence[float], values: Sequence[float], max_points: int) -> tuple[list, list]:
    """The points of a series that fit ``max_points`` (as :func:`hookscope.run_history.keep` picks)."""
    kept = keep(len(steps), max_points)
    return [steps[i] for i in kept], [values[i] for i in kept]


def spans_decades(values: Iterable[float]) -> bool:
    """True when every finite value is positive and the largest is more than 10× the smallest."""
    finite = [v for v in values if isinstance(v, int | float) and math.isfinite(v)]
    return bool(finite) and min(finite) > 0 and max(finite) / min(finite) > 10


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _number(value: float) -> float | int | str:
    """A value as the page stores it: 5 significant digits, and "nan"/"inf" as text (JSON has no NaN)."""
    if isinstance(value, int):
        return value
    value = float(value)
    if not math.isfinite(value):
        return str(value)
    rounded = float(f"{value:.5g}")
    return int(rounded) if rounded.is_integer() and abs(rounded) < 1e15 else rounded


def _json_script(spec: dict[str, Any]) -> str:
    """``spec`` as an inline JSON block: ``<``, ``>`` and ``&`` escaped, so no text in it (a layer
    named ``</script>``) can end the block or start markup."""
    text = json.dumps(spec, separators=(",", ":"), allow_nan=False)
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return f'<script type="application/json">{text}</script>'
