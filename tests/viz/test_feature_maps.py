import runpy
import sys
from pathlib import Path

import matplotlib
import pytest
import torch
from matplotlib.figure import Figure
from PIL import Image

import hookscope as hs


def _visible_panels(fig: Figure) -> list:
    return [ax for ax in fig.axes if ax.axison]


def test_64_channels_make_an_8x8_grid_without_ticks():
    fig = hs.viz.feature_maps(torch.randn(1, 64, 12, 12))
    axes = _visible_panels(fig)
    assert len(fig.axes) == 64 and len(axes) == 64
    assert axes[0].get_subplotspec().get_gridspec().get_geometry() == (8, 8)
    assert all(len(ax.get_xticks()) == 0 and len(ax.get_yticks()) == 0 for ax in axes)


def test_each_panel_shows_its_own_channel():
    maps = torch.arange(3 * 4 * 4, dtype=torch.float32).reshape(3, 4, 4)
    fig = hs.viz.feature_maps(maps, ncols=3)
    for channel, ax in enumerate(fig.axes):
        assert (ax.images[0].get_array() == maps[channel].numpy()).all()


def test_ragged_grid_hides_unused_panels_and_honours_max_maps_and_index():
    batch = torch.stack([torch.zeros(10, 5, 5), torch.ones(10, 5, 5)])
    fig = hs.viz.feature_maps(batch, ncols=4, index=1, max_maps=6, title="layer1")
    assert len(fig.axes) == 8 and len(_visible_panels(fig)) == 6
    assert fig.axes[0].images[0].get_array().min() == 1.0
    assert fig._suptitle.get_text() == "layer1"


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


def test_save_figure_writes_a_png_atomically(tmp_path):
    backend = matplotlib.get_backend()
    fig = hs.viz.feature_maps(torch.randn(16, 8, 8))
    path = hs.viz.save_figure(fig, tmp_path / "maps" / "conv1.png", dpi=50)
    assert path == tmp_path / "maps" / "conv1.png"
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size[0] > 100
    assert [p.name for p in path.parent.iterdir()] == ["conv1.png"]
    assert path.stat().st_mode & 0o044 == 0o044  # readable by others, not mkstemp's private 0600
    assert matplotlib.get_backend() == backend


def test_save_figure_refuses_other_suffixes_and_leaves_no_temp_file(tmp_path):
    fig = hs.viz.feature_maps(torch.randn(4, 8, 8))
    with pytest.raises(ValueError, match=r"maps\.jpg must end in \.png"):
        hs.viz.save_figure(fig, tmp_path / "maps.jpg")
    assert list(tmp_path.iterdir()) == []


def test_feature_maps_of_a_captured_conv(resnet18_eval, china_64):
    with torch.no_grad(), hs.capture(resnet18_eval, "conv1") as cap:
        resnet18_eval(china_64)
    fig = hs.viz.feature_maps(cap["conv1"])
    assert len(_visible_panels(fig)) == 64


def test_failed_save_keeps_the_previous_file_and_no_temp_file(tmp_path):
    path = hs.viz.save_figure(hs.viz.feature_maps(torch.randn(4, 8, 8)), tmp_path / "maps.png")
    before = path.read_bytes()
    broken = hs.viz.feature_maps(torch.randn(4, 8, 8))
    broken.axes[0].set_title(r"$\frac{$")  # invalid mathtext: rendering fails mid-save
    with pytest.raises(ValueError):
        hs.viz.save_figure(broken, path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["maps.png"]


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
