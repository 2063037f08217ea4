"""Saving figures: every PNG hookscope writes (run folders, the report's evidence, the command line) goes
through :func:`save_figure`, so a reader never sees half a file.

Figures are ``matplotlib.figure.Figure`` objects built without pyplot; rendering them (Agg) needs no
window and leaves the user's global backend alone.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING

from hookscope.atomic import atomic_write_bytes

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def save_figure(fig: Figure, path: str | Path, dpi: int = 100) -> Path:
    """Write ``fig`` as a PNG at ``path`` atomically: a reader sees the old file or the whole new one.

    The image is rendered in memory first, so a failing render leaves no file behind. Missing parent
    folders are created. Returns the path written.
    """
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise ValueError(f"save_figure: {path} must end in .png (figures are written as PNG)")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    return atomic_write_bytes(path, buffer.getvalue())
