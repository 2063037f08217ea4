"""Figures (matplotlib) and the self-contained HTML report."""

from hookscope.viz.feature_maps import feature_maps, save_figure
from hookscope.viz.plots import activation_curves, colorful_dimension, gradient_flow

__all__ = ["activation_curves", "colorful_dimension", "feature_maps", "gradient_flow", "save_figure"]
