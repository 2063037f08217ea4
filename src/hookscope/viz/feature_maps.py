"""Feature maps: draw every channel of a conv activation as a grid of small images, and save figures.

Figures are built with ``matplotlib.figure.Figure`` directly (rendered by Agg on save), never through
pyplot, so hookscope neither opens windows nor changes the user's global backend.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from hookscope.atomic import atomic_write_bytes

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def feature_maps(
    tensor: torch.Tensor,
    ncols: int | None = None,
    *,
    index: int = 0,
    max_maps: int | None = None,
    cmap: str = "viridis",
    title: str | None = None,
    panel_size: float = 1.2,
) -> Figure:
    """Return a Figure with one panel per channel of ``tensor`` (an 8×8 grid for 64 channels), no ticks.

    ``tensor`` is ``(C, H, W)`` or a batch ``(N, C, H, W)`` of which sample ``index`` is drawn. Each panel
    is scaled to its own range, as in the classic "look at the first conv" picture; ``max_maps`` keeps
    only the first channels, ``ncols`` defaults to a square-ish grid.
    """
    for arg, value in (("ncols", ncols), ("max_maps", max_maps)):
        if value is not None and value < 1:
            raise ValueError(f"feature_maps: {arg}={value} must be at least 1 (or None for the default)")
    maps = _channel_maps(tensor, index)
    if max_maps is not None:
        maps = maps[:max_maps]
    n = len(maps)
    ncols = ncols or math.ceil(math.sqrt(n))
    nrows = math.ceil(n / ncols)
    from matplotlib.figure import Figure  # matplotlib loads when a figure is drawn

    fig = Figure(figsize=(ncols * panel_size, nrows * panel_size + (0.4 if title else 0.0)))
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for i, ax in enumerate(axes.flat):
        ax.set_xticks([])
        ax.set_yticks([])
        if i < n:
            ax.imshow(maps[i].numpy(), cmap=cmap)
        else:
            ax.set_axis_off()
    if title:
        fig.suptitle(title)
    fig.subplots_adjust(
        left=0.01, right=0.99, bottom=0.01, top=0.92 if title else 0.99, wspace=0.05, hspace=0.05
    )
    return fig


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


def _channel_maps(tensor: torch.Tensor, index: int) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(
            f"feature_maps: expected a tensor (C, H, W) or (N, C, H, W), got {type(tensor).__name__}"
        )
    if tensor.dim() == 4:
        if not -tensor.shape[0] <= index < tensor.shape[0]:
            raise IndexError(f"feature_maps: index={index} is outside the batch of {tensor.shape[0]} samples")
        tensor = tensor[index]
    if tensor.dim() != 3 or tensor.shape[0] == 0:
        raise ValueError(
            f"feature_maps: expected (C, H, W) or (N, C, H, W) with C >= 1, got shape {tuple(tensor.shape)}; "
            "pass a conv activation such as cap['conv1']"
        )
    return tensor.detach().to("cpu", torch.float32)
