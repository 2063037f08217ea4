"""Figures (matplotlib) and the self-contained HTML report (matplotlib loads on first use)."""

from typing import TYPE_CHECKING

from hookscope._lazy import lazy_exports

if TYPE_CHECKING:
    from hookscope.viz.ablation import ablation_effects
    from hookscope.viz.compare import comparison_plot
    from hookscope.viz.curves import loss_curves, lr_schedule
    from hookscope.viz.feature_maps import feature_maps
    from hookscope.viz.plots import activation_curves, colorful_dimension, gradient_flow
    from hookscope.viz.report import write_report
    from hookscope.viz.save import save_figure

__all__ = [
    "ablation_effects",
    "activation_curves",
    "colorful_dimension",
    "comparison_plot",
    "feature_maps",
    "gradient_flow",
    "loss_curves",
    "lr_schedule",
    "save_figure",
    "write_report",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "ablation_effects": "hookscope.viz.ablation",
        "comparison_plot": "hookscope.viz.compare",
        "loss_curves": "hookscope.viz.curves",
        "lr_schedule": "hookscope.viz.curves",
        "feature_maps": "hookscope.viz.feature_maps",
        "save_figure": "hookscope.viz.save",
        "activation_curves": "hookscope.viz.plots",
        "colorful_dimension": "hookscope.viz.plots",
        "gradient_flow": "hookscope.viz.plots",
        "write_report": "hookscope.viz.report",
    },
)
