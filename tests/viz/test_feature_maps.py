import json
import math
import runpy
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from matplotlib.figure import Figure
from PIL import Image

import hookscope as hs


def _tiles(fig: Figure) -> list[list[np.ndarray | None]]:
    """The grid in ``fig``'s one image: rows of tiles (None for a blank cell), split at the blank gaps."""
    (ax,) = fig.axes
    (image,) = ax.images
    pixels = np.ma.filled(image.get_array().astype(float), np.nan)
    blank = np.isnan(pixels)
    rows = _runs(~blank.all(axis=1))
    cols = _runs(~blank.all(axis=0))
    return [[_tile_or_none(pixels[r][:, c]) for c in cols] for r in rows]


def _runs(filled: np.ndarray) -> list[slice]:
    edges = np.flatnonzero(np.diff(np.concatenate([[0], filled.astype(int), [0]])))
    return [slice(start, stop) for start, stop in zip(edges[::2], edges[1::2], strict=True)]


def _tile_or_none(block: np.ndarray) -> np.ndarray | None:
    return None if np.isnan(block).all() else block


def _scaled(channel: torch.Tensor) -> np.ndarray:
    channel = channel.numpy().astype(float)
    return (channel - channel.min()) / (channel.max() - channel.min())


def test_64_channels_make_an_8x8_grid_in_one_image_without_ticks():
    fig = hs.viz.feature_maps(torch.randn(1, 64, 12, 12))
    tiles = _tiles(fig)
    assert [len(row) for row in tiles] == [8] * 8
    assert all(tile is not None and tile.shape == (12, 12) for row in tiles for tile in row)
    assert not fig.axes[0].axison  # no ticks, no frame


def test_each_tile_shows_its_own_channel_scaled_to_its_own_range():
    maps = torch.randn(3, 4, 5) * torch.tensor([1.0, 10.0, 100.0]).view(3, 1, 1)
    (row,) = _tiles(hs.viz.feature_maps(maps, ncols=3))
    for channel, tile in enumerate(row):
        np.testing.assert_allclose(tile, _scaled(maps[channel]), atol=1e-6)


def test_ragged_grid_leaves_unused_cells_blank_and_honours_max_maps_and_index():
    batch = torch.stack([torch.zeros(10, 5, 5), torch.arange(250.0).reshape(10, 5, 5)])
    fig = hs.viz.feature_maps(batch, ncols=4, index=1, max_maps=6, title="layer1")
    tiles = _tiles(fig)
    assert [[tile is not None for tile in row] for row in tiles] == [[True] * 4, [True, True, False, False]]
    np.testing.assert_allclose(tiles[1][1], _scaled(batch[1, 5]), atol=1e-6)
    assert fig._suptitle.get_text() == "layer1"


def test_constant_and_non_finite_pixels_draw_without_error():
    maps = torch.ones(2, 4, 4)
    maps[1, 0, 0] = math.nan
    maps[1, 1, 1] = 5.0
    pixels = np.ma.filled(hs.viz.feature_maps(maps).axes[0].images[0].get_array().astype(float), np.nan)
    assert np.nanmin(pixels) == 0.0 and np.nanmax(pixels) == 1.0  # constant map 0; 5 the top of its range
    assert np.isnan(pixels[0, 5])  # the NaN pixel of map 1 stays blank, as imshow drew it before


def test_bad_shapes_raise_one_line_errors():
    with pytest.raises(ValueError, match=r"got shape \(5, 5\)"):
        hs.viz.feature_maps(torch.zeros(5, 5))
    with pytest.raises(IndexError, match="index=2 is outside the batch of 2"):
        hs.viz.feature_maps(torch.zeros(2, 3, 4, 4), index=2)
    with pytest.raises(ValueError, match="ncols=0 must be at least 1"):
        hs.viz.feature_maps(torch.zeros(3, 4, 4), ncols=0)
    with pytest.raises(ValueError, match="max_maps=0 must be at least 1"):
        hs.viz.feature_maps(torch.zeros(3, 4, 4), max_maps=0)
    with pytest.raises(TypeError, match="got ndarray"):
        hs.viz.feature_maps(torch.zeros(3, 4, 4).numpy())


def test_feature_maps_of_a_captured_conv(resnet18_eval, china_64):
    with torch.no_grad(), hs.capture(resnet18_eval, "conv1") as cap:
        resnet18_eval(china_64)
    tiles = _tiles(hs.viz.feature_maps(cap["conv1"]))
    assert sum(tile is not None for row in tiles for tile in row) == 64


@pytest.mark.slow  # builds a ResNet34 and draws 64 panels: ~2 s idle, ~10 s on a loaded 2-core box
def test_example_script_writes_the_png_and_lists_36_convs(tmp_path, monkeypatch, capsys):
    script = Path(__file__).parents[2] / "examples" / "feature_maps.py"
    monkeypatch.setattr(sys, "argv", [str(script), "--out", str(tmp_path)])
    runpy.run_path(str(script), run_name="__main__")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["conv1", "(1,", "64,", "112,", "112)"]
    assert "36 Conv2d outputs captured" in lines
    with Image.open(tmp_path / "conv1_feature_maps.png") as image:
        assert image.format == "PNG"


def test_report_title_names_the_run_not_its_partial_folder(tmp_path):
    partial = tmp_path / ".demo.partial"
    partial.mkdir()
    (partial / "config.json").write_text(json.dumps({"name": "demo", "status": "running", "options": {}}))
    page = hs.viz.write_report(partial).read_text()
    assert "<title>hookscope report: demo</title>" in page
