"""Figures (matplotlib) and the self-contained HTML report."""

from hookscope.viz.feature_maps import feature_maps, save_figure

__all__ = ["feature_maps", "save_figure"]
