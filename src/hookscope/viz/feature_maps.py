"""Feature maps: draw every channel of a conv activation as a grid of small images.

Figures are built with ``matplotlib.figure.Figure`` directly (rendered by Agg on save), never through
pyplot, so hookscope neither opens windows nor changes the user's global backend.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from hookscope._deprecation import moved_names

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["feature_maps"]

# save_figure lived here; hookscope.viz.save is its home (the old path warns for a release)
__getattr__ = moved_names(__name__, {"save_figure": "hookscope.viz.save"})


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
    """Return a Figure showing each channel of ``tensor`` as a tile of a grid (8×8 for 64 channels).

    ``tensor`` is ``(C, H, W)`` or a batch ``(N, C, H, W)`` of which sample ``index`` is drawn. Each map
    is scaled to its own range, as in the classic "look at the first conv" picture; ``max_maps`` keeps
    only the first channels, ``ncols`` defaults to a square-ish grid. The tiles, separated by blank gaps,
    form one image on one axes without ticks: drawing it costs one ``imshow``, not one subplot per map.
    """
    for arg, value in (("ncols", ncols), ("max_maps", max_maps)):
        if value is not None and value < 1:
            raise ValueError(f"feature_maps: {arg}={value} must be at least 1 (or None for the default)")
    maps = _channel_maps(tensor, index)
    if max_maps is not None:
        maps = maps[:max_maps]
    ncols = ncols or math.ceil(math.sqrt(len(maps)))
    nrows = math.ceil(len(maps) / ncols)
    from matplotlib.figure import Figure  # matplotlib loads when a figure is drawn

    fig = Figure(figsize=(ncols * panel_size, nrows * panel_size + (0.4 if title else 0.0)))
    ax = fig.add_axes((0.01, 0.01, 0.98, 0.91 if title else 0.98))
    ax.set_axis_off()
    ax.imshow(_tile(_normalise(maps), nrows, ncols).numpy(), cmap=cmap, vmin=0.0, vmax=1.0)
    if title:
        fig.suptitle(title)
    return fig


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


def _normalise(maps: torch.Tensor) -> torch.Tensor:
    """Scale each ``(H, W)`` map to [0, 1] over its finite values, as imshow scaled each panel before.

    Non-finite pixels become NaN, drawn blank as before; a constant map draws in the lowest colour.
    """
    finite = maps.isfinite()
    inf = torch.tensor(math.inf)
    low = torch.where(finite, maps, inf).amin(dim=(1, 2), keepdim=True)
    high = torch.where(finite, maps, -inf).amax(dim=(1, 2), keepdim=True)
    span = high - low
    scaled = (maps - low) / torch.where(span > 0, span, 1.0)
    return torch.where(finite, scaled, math.nan)


def _tile(maps: torch.Tensor, nrows: int, ncols: int) -> torch.Tensor:
    """Lay ``(C, H, W)`` maps out row by row in an ``nrows`` × ``ncols`` grid, with NaN (blank) gaps.

    The gap is about 5% of a map's side, the spacing the grid of subplots had; unused cells stay blank.
    """
    _, height, width = maps.shape
    gap = max(1, round(0.05 * max(height, width)))
    grid = torch.full((nrows * (height + gap) - gap, ncols * (width + gap) - gap), math.nan)
    for i, tile in enumerate(maps):
        top, left = (i // ncols) * (height + gap), (i % ncols) * (width + gap)
        grid[top : top + height, left : left + width] = tile
    return grid
