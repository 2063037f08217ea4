"""Figures (matplotlib) and the self-contained HTML report."""
