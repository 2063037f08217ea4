"""The ablation figure: how much the metric moves when each layer (or unit) is switched off."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from hookscope.hooks.ablate import Ablation


def ablation_effects(ablation: Ablation, top: int = 30) -> Figure:
    """Horizontal bars of each ablation's effect (metric ablated minus baseline), largest first.

    Takes what :func:`hookscope.ablate` returned; ``top`` keeps the largest effects (all when there are
    fewer). Bars that make the metric larger are red, smaller blue; the title gives the baseline.
    """
    rows = ablation.rows[:top]
    if not rows:
        raise ValueError("ablation_effects: the ablation has no rows; ablate at least one module")
    from matplotlib.figure import Figure  # matplotlib loads when a figure is drawn

    labels = [f"{r.name}[{r.unit}]" if r.unit is not None else r.name for r in rows]
    effects = [r.effect for r in rows]
    fig = Figure(figsize=(7.5, 1.2 + 0.32 * len(rows)))
    ax = fig.add_subplot()
    positions = list(range(len(rows)))[::-1]  # the largest effect on top
    colors = ["#c62828" if e > 0 else "#2f6fde" for e in effects]
    ax.barh(positions, effects, color=colors)
    ax.set_yticks(positions, labels, fontsize="small")
    ax.axvline(0.0, color="black", linewidth=0.8)
    ax.set_xlabel(f"change in {ablation.metric_name} when switched off ({ablation.how} ablation)")
    ax.set_title(f"ablation per {ablation.per}: baseline {ablation.metric_name} = {ablation.baseline:.4f}")
    fig.tight_layout()
    return fig
