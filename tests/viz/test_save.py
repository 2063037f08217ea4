"""save_figure (hookscope/viz/save.py): PNGs written atomically, without touching the global backend."""

import matplotlib
import pytest
import torch
from PIL import Image

import hookscope as hs


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


def test_failed_save_keeps_the_previous_file_and_no_temp_file(tmp_path):
    path = hs.viz.save_figure(hs.viz.feature_maps(torch.randn(4, 8, 8)), tmp_path / "maps.png")
    before = path.read_bytes()
    broken = hs.viz.feature_maps(torch.randn(4, 8, 8))
    broken.axes[0].set_title(r"$\frac{$")  # invalid mathtext: rendering fails mid-save
    with pytest.raises(ValueError):
        hs.viz.save_figure(broken, path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["maps.png"]
