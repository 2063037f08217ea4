"""The plot behind each doctor finding, for the report: what the rule saw, with the place marked.

- the loss kinds (``loss_divergence``, ``plateau``, ``oscillating_loss``): the loss per step, the stretch
  the finding covers shaded;
- ``overfitting``: training and validation loss per epoch, the best epoch marked;
- the gradient kinds (``exploding_gradient``, ``vanishing_gradient``, ``no_gradient``, ``update_ratio``,
  ``not_updated``): the gradient-flow chart with the finding's layer marked;
- ``dead_units`` / ``saturation``: the layer's dead (or saturated) fraction per recorded step, with the
  threshold and the step since which it holds.

Other kinds (NaN/Inf, frozen parameters, preflight) have no curve to show: their message says it all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from hookscope.doctor.findings import Finding
from hookscope.doctor.record_types import ParamRecord, StepStats
from hookscope.viz.plots import gradient_flow
from hookscope.viz.save import save_figure

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from hookscope.doctor.engine import Engine

LOSS_KINDS = frozenset({"loss_divergence", "plateau", "oscillating_loss"})
FLOW_KINDS = frozenset(
    {"exploding_gradient", "vanishing_gradient", "no_gradient", "update_ratio", "not_updated"}
)
MARK = "tab:red"


def evidence_figure(finding: Finding, engine: Engine) -> Figure | None:
    """The figure showing ``finding``'s evidence from what ``engine`` recorded; None for kinds that have
    no curve, or when the records it needs are gone."""
    if finding.kind in LOSS_KINDS and engine.loss_history:
        return _loss_figure(finding, engine.loss_history)
    if finding.kind == "overfitting":
        return _epochs_figure(finding)
    if finding.kind in FLOW_KINDS and any(engine.gradients.param_history.values()):
        return _flow_figure(finding, engine.gradients.param_history)
    if finding.kind == "dead_units" and engine.activations.history.get(finding.module):
        records = engine.activations.history[finding.module]
        return _fraction_figure(finding, _dead_fractions(records), engine.thresholds.dead_fraction, "dead")
    if finding.kind == "saturation" and engine.saturation_history.get(finding.module):
        series = engine.saturation_history[finding.module]
        return _fraction_figure(finding, series, engine.thresholds.saturated_fraction, "saturated")
    return None


def write_finding_figures(findings: Sequence[Finding], engine: Engine, path: Callable[[str], Path]) -> None:
    """``figures/finding_NN.png`` for the ``NN``-th of ``findings`` (the order of findings.json) that has
    a figure; the report puts each beside its finding."""
    for index, finding in enumerate(findings):
        fig = evidence_figure(finding, engine)
        if fig is not None:
            save_figure(fig, path(f"figures/finding_{index:02d}.png"))


def _new_figure(finding: Finding) -> tuple[Figure, Axes]:
    from matplotlib.figure import Figure  # matplotlib loads when a figure is drawn

    fig = Figure(figsize=(6, 3.2))
    ax = fig.subplots()
    where = f" `{finding.module}`" if finding.module else ""
    ax.set_title(f"{finding.kind}{where} since step {finding.step}", fontsize="medium")
    ax.grid(alpha=0.3)
    return fig, ax


def _loss_figure(finding: Finding, losses: Sequence[tuple[int, float]]) -> Figure:
    fig, ax = _new_figure(finding)
    steps, values = zip(*losses, strict=True)
    ax.plot(steps, values, color="#2f6fde", linewidth=1, label="training loss (step)")
    ax.axvspan(finding.step, steps[-1], color=MARK, alpha=0.12, label=finding.kind.replace("_", " "))
    ax.set_xlabel("training step")
    ax.set_ylabel("loss")
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def _epochs_figure(finding: Finding) -> Figure:
    fig, ax = _new_figure(finding)
    valid, train = finding.evidence["valid_losses"], finding.evidence["train_losses"]
    epochs = range(1, len(valid) + 1)
    ax.plot(epochs, train, "o-", label="train loss (epoch)")
    ax.plot(epochs, valid, "s-", label="valid loss (epoch)")
    best = finding.evidence["best_epoch"]
    ax.axvline(best + 1, color=MARK, linestyle="--", label=f"best validation: epoch {best + 1}")
    ax.set_xlabel("epoch")
    ax.set_ylabel("loss")
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def _flow_figure(finding: Finding, params: dict[str, list[ParamRecord]]) -> Figure:
    fig = gradient_flow(params)
    axes = fig.get_axes()
    labels = [t.get_text() for t in axes[-1].get_xticklabels()]
    if finding.module in labels:
        x = labels.index(finding.module)
        for ax in axes:
            ax.axvspan(x - 0.5, x + 0.5, color=MARK, alpha=0.15)
        axes[-1].get_xticklabels()[x].set_color(MARK)
    axes[0].set_title(f"gradient flow — {finding.kind} at `{finding.module or 'the model'}`")
    return fig


def _dead_fractions(records: Sequence[StepStats]) -> list[tuple[int, float]]:
    return [(r.step, r.stats.dead_fraction()) for r in records]


def _fraction_figure(
    finding: Finding, series: Sequence[tuple[int, float]], threshold: float, what: str
) -> Figure:
    fig, ax = _new_figure(finding)
    steps, values = zip(*series, strict=True)
    ax.plot(steps, values, "o-", markersize=3, label=f"{what} fraction (recorded steps)")
    ax.axhline(threshold, color="gray", linestyle="--", label=f"threshold {threshold:g}")
    ax.axvline(finding.step, color=MARK, linestyle=":", label=f"since step {finding.step}")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("training step")
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig
