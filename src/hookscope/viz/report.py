"""The run report: one self-contained HTML file built from a run folder; no network.

Everything comes from the files of the run folder (``config.json``, ``metrics.jsonl``, ``findings.json``,
``summary.json``, ``stats.json``, ``timing.json``, ``history.json``, ``figures/*.png``), so ``hookscope report
RUN_DIR`` can rebuild the report at any time. Figures are embedded as ``data:`` URIs, the style sheet and the
chart script are inline: the file can be mailed, attached to an issue or opened from a laptop with no network.
A figure is placed in its section by the start of its file name (``loss*.png`` under "Training curves",
``feature_maps*.png`` under "Feature maps"...). Where history.json or metrics.jsonl has the data, a section
shows interactive charts (:mod:`hookscope.viz.report_charts`) instead of the figure drawn from it.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

from hookscope._deprecation import renamed_keywords
from hookscope.atomic import atomic_write_text
from hookscope.run_history import read_history
from hookscope.run_reader import REPORT, read_metrics
from hookscope.viz.charts import page_head
from hookscope.viz.page import (
    figure_html,
    finding_layer,
    format_value,
    page_html,
    section_html,
    severity_badge,
    table_html,
)
from hookscope.viz.report_charts import SectionCharts, report_charts

WIDE_ASPECT = 2.4  # figures wider than this (loss + metrics side by side) take the whole row

# (section title, figure file-name prefixes, what the reader looks at)
SECTIONS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    (
        "Training curves",
        ("loss", "metric"),
        "Training and validation loss, and the metrics, per step and epoch.",
    ),
    ("Learning-rate schedule", ("lr",), "The learning rate the optimizer used at every step."),
    (
        "Activations",
        ("activation", "colorful"),
        "Per-layer activation statistics over training; the colorful-dimension images show, step by step "
        "(x axis), the histogram of each layer's activations (y axis, darker = fewer values).",
    ),
    (
        "Gradient flow",
        ("gradient",),
        "Gradient norms per layer: vanishing gradients show as a collapsing bar.",
    ),
    ("Feature maps", ("feature_maps",), "What the first conv layers produce on one validation sample."),
)

CAPTIONS: tuple[tuple[str, str], ...] = (
    ("loss", "Loss per training step (raw and smoothed) and per epoch; validation metrics per epoch"),
    ("lr", "Learning rate at every training step"),
    ("activations", "Mean, standard deviation and fraction of dead units of each layer's output, per step"),
    ("colorful", "Colorful dimension of {layer}: its histogram at every step"),
    (
        "gradient_flow",
        "Gradient norm per layer (median bar, range line, last step dot) and update/weight ratio",
    ),
    ("feature_maps", "Feature maps of {layer}"),
)


EMBEDDED_EVIDENCE = 20  # findings whose evidence plot is drawn in the page; the others name their file


@renamed_keywords(run_dir="path")
def write_report(path: str | Path) -> Path:
    """Build ``path/report.html`` from the files of the run folder ``path`` and return its path."""
    run_dir = Path(path)
    config = _read_json(run_dir / "config.json", {})
    rows = read_metrics(run_dir)
    summary = _read_json(run_dir / "summary.json", {})
    findings = _read_json(run_dir / "findings.json", None)
    stats = _read_json(run_dir / "stats.json", [])
    # finding_NN.png: the evidence of the NN-th finding, drawn in the findings table beside it
    figures = [f for f in sorted((run_dir / "figures").glob("*.png")) if not f.stem.startswith("finding_")]
    charts = report_charts(read_history(run_dir), rows, findings or [])
    body = [
        _header(config, rows, summary),
        *_figure_sections(figures, config, summary, charts),
        _preflight_section(_read_json(run_dir / "preflight.json", None)),
        _findings_section(findings, run_dir / "figures"),
        _performance_section(_read_json(run_dir / "timing.json", None)),
        _stats_section(stats),
        _pruning_section(_read_json(run_dir / "pruning.json", None)),
        _summary_section(summary),
        _trackers_section(config.get("trackers", {})),
        _config_section(config),
    ]
    title = f"hookscope report: {config.get('name') or run_dir.name}"  # not the .NAME.partial folder
    page = page_html(title, "\n".join(body), head=page_head() if charts else "")
    return atomic_write_text(run_dir / REPORT, page)


def write_feature_map_index(path: str | Path, layers: Iterable[tuple[str, str, str]], title: str) -> Path:
    """Write ``path/index.html`` listing ``(layer name, png file name, shape)`` grids next to it."""
    folder = Path(path)
    figures = [
        f'<figure><img src="{html.escape(png)}" alt="feature maps of {html.escape(name)}">'
        f"<figcaption><code>{html.escape(name)}</code> output {html.escape(shape)}</figcaption></figure>"
        for name, png, shape in layers
    ]
    body = (
        f"<header><h1>{html.escape(title)}</h1><p>One grid of feature maps per selected layer, in model "
        "order.</p></header>\n"
        f'<div class="figs">{"".join(figures)}</div>'
    )
    return atomic_write_text(folder / "index.html", page_html(title, body))


def _header(config: dict[str, Any], rows: list[dict[str, Any]], summary: dict[str, Any]) -> str:
    options, learner = config.get("options", {}), config.get("learner", {})
    epochs = [r for r in rows if r.get("kind") == "epoch"]
    last = epochs[-1] if epochs else {}
    model = options.get("model") or learner.get("model") or ""
    cards = [
        ("model", str(model).rpartition(":")[2] or None),
        ("data", options.get("data")),
        ("parameters", _count(summary.get("total_params"))),
        ("MACs / sample", _count(summary.get("total_macs"))),
        ("epochs", len(epochs) or None),
        ("training time", _duration(config.get("duration_s"))),
    ]
    cards += [
        (key.replace("_", " "), format_value(value)) for key, value in last.items() if _is_final_metric(key)
    ]
    status = config.get("status", "complete")
    if status != "complete":
        cards.insert(0, ("status", "unfinished run" if status == "running" else status))
    shown = "".join(
        f'<div class="card"><div class="k">{html.escape(k)}</div>'
        f'<div class="v">{html.escape(str(v))}</div></div>'
        for k, v in cards
        if v is not None
    )
    started = _when(config.get("started", ""))
    command = config.get("command", "")
    return (
        f"<header><h1>hookscope run <code>{html.escape(str(config.get('name', '')))}</code></h1>"
        f"<p>{html.escape(started)} · <code>{html.escape(command)}</code></p>"
        f"{_stopped(config)}"
        f'<div class="cards">{shown}</div></header>'
    )


def _stopped(config: dict[str, Any]) -> str:
    """Where and why a run that did not complete stopped (from config.json's ``stopped_at``/``error``)."""
    where = config.get("stopped_at")
    if not where:
        return ""
    text = (
        f"The run {config.get('status', 'stopped')} at epoch {where['epoch'] + 1}, "
        f"batch {where['batch'] + 1} of the {where['phase']} phase (training step {where['training_step']})"
    )
    if config.get("error"):
        text += f": {config['error']}"
    return f'<p class="stopped">{html.escape(text)}</p>'


def _is_final_metric(key: str) -> bool:
    return key not in ("kind", "epoch", "step", "time", "lr")


def _figure_sections(
    figures: list[Path], config: dict[str, Any], summary: dict[str, Any], charts: dict[str, SectionCharts]
) -> list[str]:
    placed: set[Path] = set()
    sections = []
    for title, prefixes, lead in SECTIONS:
        mine = [f for f in figures if f.stem.startswith(prefixes)]
        placed.update(mine)
        interactive = charts.get(title, SectionCharts("", ()))
        mine = [f for f in mine if f.stem not in interactive.replaces]
        body = interactive.html + (_figures_html(mine) if mine else "")
        sections.append(section_html(title, lead, body or _missing(title, config, summary)))
    others = [f for f in figures if f not in placed]
    if others:
        sections.append(section_html("Other figures", "", _figures_html(others)))
    return sections


def _missing(title: str, config: dict[str, Any], summary: dict[str, Any]) -> str:
    """Why a section has no figure, when the run folder tells."""
    options = config.get("options", {})
    layer_types = {row.get("type") for row in summary.get("rows", [])}
    if title == "Feature maps" and layer_types and "Conv2d" not in layer_types:
        return '<p class="note">The model has no Conv2d layer, so there are no feature maps to draw.</p>'
    if title in ("Activations", "Gradient flow") and options.get("doctor") is False:
        return (
            '<p class="note">Not recorded: the run used --no-doctor, which also turns the statistics off.</p>'
        )
    return '<p class="note">Not recorded in this run.</p>'


def _figures_html(figures: list[Path]) -> str:
    items = [
        figure_html(path.read_bytes(), _caption(path.stem), _aspect(path) > WIDE_ASPECT) for path in figures
    ]
    return f'<div class="figs">{"".join(items)}</div>'


def _caption(stem: str) -> str:
    """A readable caption for the figure names the train job writes; other figures keep their name."""
    for prefix, text in CAPTIONS:
        if stem == prefix or stem.startswith(prefix + "_"):
            layer = stem[len(prefix) + 1 :]
            return text.format(layer=layer) if layer else text.replace(" {layer}", "")
    return stem.replace("_", " ")


def _aspect(png: Path) -> float:
    """Width / height from the PNG header (bytes 16-24 of the IHDR chunk), without decoding the image."""
    with png.open("rb") as f:
        header = f.read(24)
    width, height = int.from_bytes(header[16:20], "big"), int.from_bytes(header[20:24], "big")
    return width / height if height else 1.0


def _findings_section(findings: list[dict[str, Any]] | None, figures: Path) -> str:
    lead = (
        "What the doctor saw while training, most severe first, with the layer where it happened and the "
        "plot that shows it."
    )
    if findings is None:
        return section_html("Doctor's findings", lead, '<p class="note">The doctor was off for this run.</p>')
    # findings.json puts each cause's symptoms right after it: they are shown nested under it
    causes = {tuple(key): f.get("kind", "") for f in findings for key in f.get("explains", [])}
    rows = [
        [
            severity_badge(f),
            f"<code>{html.escape(str(finding_layer(f)))}</code>",
            html.escape(format_value(f.get("step", ""))),
            _symptom_of(causes.get((f.get("kind"), f.get("module"))))
            + html.escape(str(f.get("message", "")))
            + _evidence(figures / f"finding_{i:02d}.png", embed=i < EMBEDDED_EVIDENCE),
        ]
        for i, f in enumerate(findings)
    ]
    if not rows:
        rows = [['<span class="sev sev-ok">ok</span>', "", "", "No problem found."]]
    table = table_html(["severity", "layer", "step", "message"], rows, numeric={2}, table_id="findings")
    return section_html("Doctor's findings", lead, table)


def _symptom_of(cause: str | None) -> str:
    """The lead of a symptom's message: the cause above it that explains it (nothing for others)."""
    if cause is None:
        return ""
    return f'<span class="note">&#8627; explained by <code>{html.escape(cause)}</code> above:</span> '


def _evidence(png: Path, embed: bool) -> str:
    """The finding's evidence figure, when the run drew one: inline, or named past the first
    :data:`EMBEDDED_EVIDENCE` findings (a page of a hundred findings would weigh over 10 MB)."""
    if not png.is_file():
        return ""
    if embed:
        return _figures_html([png])
    return f' <span class="note">(plot: <code>figures/{html.escape(png.name)}</code>)</span>'


def _preflight_section(findings: list[dict[str, Any]] | None) -> str:
    """What ``hs.preflight`` found before training (kind, module, message); nothing when it did not run."""
    if findings is None:
        return ""
    lead = (
        "Checked before training on a copy of the model: labels, output and loss, input scale, samples "
        "mixing in a batch, the loss at initialisation, and overfitting one batch."
    )
    rows = [
        [
            severity_badge(f),
            html.escape(str(f.get("kind", ""))),
            f"<code>{html.escape(str(finding_layer(f)))}</code>",
            html.escape(str(f.get("message", ""))),
        ]
        for f in findings
    ]
    if not rows:
        rows = [['<span class="sev sev-ok">ok</span>', "", "", "Every preflight check passed."]]
    table = table_html(["severity", "check", "layer", "message"], rows, numeric=set(), table_id="preflight")
    return section_html("Preflight", lead, table)


def _stats_section(stats: list[dict[str, Any]]) -> str:
    lead = (
        "Activation statistics per layer at the last recorded step (accumulated on the device): mean, std, "
        "dead units and non-finite count over every value; abs_max and zeros over the sampled values."
    )
    if not stats:
        return section_html(
            "Per-layer activation statistics", lead, '<p class="note">Not recorded in this run.</p>'
        )
    columns = list(stats[0])
    rows = [[html.escape(format_value(row.get(c, ""))) for c in columns] for row in stats]
    numeric = {i for i, c in enumerate(columns) if isinstance(stats[0].get(c), int | float)}
    return section_html("Per-layer activation statistics", lead, table_html(columns, rows, numeric, "stats"))


def _performance_section(timing: dict[str, Any] | None) -> str:
    """Where the time went (drawn here from timing.json: matplotlib loads only when there is one)."""
    if timing is None:
        return ""
    from hookscope.viz.performance import LEAD, performance_html

    return section_html("Performance", LEAD, performance_html(timing))


def _pruning_section(pruning: dict[str, Any] | None) -> str:
    """The Pruning callback's schedule and the sparsity it left per layer; nothing when it did not run."""
    if not pruning:
        return ""
    kind = "structured" if pruning.get("structured") else "unstructured"
    lead = (
        f"{kind.capitalize()} {pruning.get('how')} pruning ({pruning.get('scope')} scope) from "
        f"{format_value(pruning.get('initial_sparsity'))} to "
        f"{format_value(pruning.get('final_sparsity'))} sparsity between "
        f"steps {pruning.get('start_step')} and {pruning.get('end_step')}, every {pruning.get('every')} steps"
        + (f", rewound to step {pruning['rewind_step']}" if pruning.get("rewind_step") is not None else "")
        + f". Reached {format_value(pruning.get('sparsity', {}).get('total'))} overall."
    )
    keys = ["name", "param", "numel", "zeros", "sparsity", "channels_pruned", "channels"]
    rows = [
        [html.escape(format_value(row.get(k, ""))) for k in keys]
        for row in pruning.get("sparsity", {}).get("rows", [])
    ]
    schedule = ", ".join(f"step {int(step)}: {target:.3f}" for step, target, _ in pruning.get("log", []))
    body = table_html(["layer", *keys[1:]], rows, numeric={2, 3, 4, 5, 6}, table_id="pruning")
    return section_html(
        "Pruning", lead, body + f'<p class="note">Schedule followed: {html.escape(schedule)}</p>'
    )


def _summary_section(summary: dict[str, Any]) -> str:
    lead = "Every layer with its output shape, parameters and multiply-accumulates for one validation sample."
    rows_in = summary.get("rows", [])
    if not rows_in:
        return section_html("Model summary", lead, '<p class="note">Not recorded in this run.</p>')
    columns = list(rows_in[0])
    rows = [[html.escape(format_value(row.get(c, ""))) for c in columns] for row in rows_in]
    numeric = {i for i, c in enumerate(columns) if isinstance(rows_in[0].get(c), int | float)}
    totals = (
        f"<p>Total parameters <b>{_count(summary.get('total_params'))}</b> · trainable "
        f"<b>{_count(summary.get('trainable_params'))}</b> · MACs per sample "
        f"<b>{_count(summary.get('total_macs'))}</b></p>"
    )
    return section_html("Model summary", lead, totals + table_html(columns, rows, numeric, "summary"))


def _trackers_section(trackers: dict[str, dict[str, str]]) -> str:
    """Where each tracker callback (TensorBoard, W&B, MLflow) wrote, and the command that opens it."""
    if not trackers:
        return ""
    rows = [
        [
            html.escape(name),
            f"<code>{html.escape(t.get('path', ''))}</code>",
            f"<code>{html.escape(t.get('open', ''))}</code>",
        ]
        for name, t in trackers.items()
    ]
    lead = "The experiment trackers this run logged to; paths are inside the run folder unless absolute."
    table = table_html(["tracker", "where", "open it (from the run folder)"], rows, set(), "trackers")
    return section_html("Trackers", lead, table)


def _config_section(config: dict[str, Any]) -> str:
    text = html.escape(json.dumps(config, indent=2, default=str))
    body = (
        "<details><summary>config.json (every option and library version)</summary>"
        f"<pre>{text}</pre></details>"
    )
    return section_html("Configuration", "", body)


def _count(value: Any) -> str | None:
    if not isinstance(value, int | float):
        return None
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.2f} {unit}"
    return str(int(value))


def _when(iso: str) -> str:
    """``2026-11-22T03:47:44+00:00`` -> ``2026-11-22 03:47 UTC`` (anything else is shown as it is)."""
    try:
        moment = datetime.fromisoformat(iso)
    except ValueError:
        return iso
    return moment.strftime("%Y-%m-%d %H:%M %Z").strip()


def _duration(seconds: Any) -> str | None:
    if not isinstance(seconds, int | float):
        return None
    minutes, secs = divmod(float(seconds), 60)
    return f"{int(minutes)} min {secs:.0f} s" if minutes else f"{secs:.1f} s"


def _read_json(path: Path, default: Any) -> Any:
    if not path.is_file():
        return default
    return json.loads(path.read_text(encoding="utf-8"))
