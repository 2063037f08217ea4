"""The report's Performance section: where each training step's time went and memory over the run.

Drawn from ``timing.json`` (written by the run folder from the doctor's
:class:`~hookscope.doctor.timing.TimingRecorder`, see its ``record()``): a row of cards with the mean
time per step in each phase, and one figure of three panels — the phases stacked over the whole run
(blocks of steps), the distribution of the recent step times (stalls stand out on the right) and the
memory the doctor sampled (CUDA allocated memory, or the process's resident memory on the CPU).
"""

from __future__ import annotations

import base64
import html
import io
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure

COLORS = {
    "data": "#e08a00",
    "forward": "#2f6fde",
    "backward": "#7b4fd6",
    "optimizer": "#2e7d32",
    "other": "#9aa5b1",
}
LEAD = (
    "Where each training step's time went (waiting for data, forward, backward, optimizer, the rest of "
    "the step), how long the steps took, and memory over the run, as the doctor timed them."
)


def performance_html(timing: dict[str, Any]) -> str:
    """The section's body: the breakdown cards and the figure (a ``data:`` PNG)."""
    phases = timing["step_phases"]
    breakdown = timing["breakdown_s"]
    step = sum(breakdown[p] for p in phases)
    cards = [("step (mean)", _ms(step)), ("steps timed", f"{timing['steps_timed']:,}")]
    cards += [(f"{p} · {breakdown[p] / step:.0%}" if step else p, _ms(breakdown[p])) for p in phases]
    stalls = timing["stalls"]
    if stalls:
        cards.append(("stalls", str(len(stalls))))
    cards_html = "".join(
        f'<div class="card"><div class="k">{html.escape(k)}</div><div class="v">{html.escape(v)}</div></div>'
        for k, v in cards
    )
    buffer = io.BytesIO()
    performance_figure(timing).savefig(buffer, format="png", dpi=100)
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    caption = (
        "Time per step in each phase over the run (blocks of steps); the recent step times (median "
        "dashed); memory over the run"
    )
    figure = (
        f'<div class="figs"><figure class="wide"><img src="data:image/png;base64,{data}" '
        f'alt="{html.escape(caption)}"><figcaption>{html.escape(caption)}</figcaption></figure></div>'
    )
    return f'<div class="cards">{cards_html}</div>{figure}'


def performance_figure(timing: dict[str, Any]) -> Figure:
    """Three panels: the phases stacked over the run, the step-time histogram, memory over the run."""
    from matplotlib.figure import Figure  # matplotlib loads when a figure is drawn

    fig = Figure(figsize=(14, 3.8), layout="constrained")
    stacked, spread, memory = fig.subplots(1, 3, width_ratios=(1.6, 1, 1))
    _stacked(stacked, timing)
    _spread(spread, timing["recent"]["step_s"])
    _memory(memory, timing["memory"])
    return fig


def _stacked(ax: Any, timing: dict[str, Any]) -> None:
    run, phases = timing["run"], timing["step_phases"]
    seconds = np.array(run["seconds"], dtype=float).reshape(-1, len(timing["columns"]))
    if not len(seconds):
        _empty(ax, "no step timed")
        return
    steps = np.array(run["first_steps"])
    columns = [seconds[:, timing["columns"].index(p)] * 1e3 for p in phases]
    ax.stackplot(steps, columns, labels=phases, colors=[COLORS[p] for p in phases], step="post")
    ax.set(xlabel="training step", ylabel="ms per step", title="Where each step's time went")
    ax.legend(loc="upper left", fontsize=8, ncol=len(phases), frameon=False)
    ax.set_ylim(0, max(1e-3, float(np.sum(columns, axis=0).max())) * 1.25)


def _spread(ax: Any, step_s: list[float]) -> None:
    if not step_s:
        _empty(ax, "no step timed after the warm-up")
        return
    ms = np.array(step_s) * 1e3
    ax.hist(ms, bins=min(60, max(10, len(ms) // 8)), color=COLORS["forward"], alpha=0.8)
    ax.axvline(float(np.median(ms)), color="#1f2933", linestyle="--", linewidth=1)
    ax.set(xlabel="ms per step", ylabel="steps", title=f"Step time (last {len(ms):,} steps)")


def _memory(ax: Any, memory: dict[str, Any]) -> None:
    if not memory["bytes"]:
        _empty(ax, "memory not sampled")
        return
    mb = np.array(memory["bytes"]) / (1 << 20)
    ax.plot(memory["first_steps"], mb, color=COLORS["backward"], linewidth=1.5)
    ax.set(xlabel="training step", ylabel="MB", title=(memory["what"] or "memory").capitalize())
    low, high = float(mb.min()), float(mb.max())
    pad = max(1.0, 0.1 * (high - low))
    ax.set_ylim(low - pad, high + pad)


def _empty(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#616e7c")
    ax.set_axis_off()


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.0f} µs"
