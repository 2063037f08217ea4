"""Figures (matplotlib) and the self-contained HTML report."""

from hookscope.viz.curves import loss_curves, lr_schedule
from hookscope.viz.feature_maps import feature_maps, save_figure
from hookscope.viz.plots import activation_curves, colorful_dimension, gradient_flow
from hookscope.viz.report import write_report

__all__ = [
    "activation_curves",
    "colorful_dimension",
    "feature_maps",
    "gradient_flow",
    "loss_curves",
    "lr_schedule",
    "save_figure",
    "write_report",
]
