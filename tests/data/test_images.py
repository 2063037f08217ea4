import numpy as np
import pytest
import torch
from PIL import Image

from hookscope.data.images import load_image, sample_image


def test_sample_image_shape_and_range():
    x = sample_image(224)
    assert x.shape == (1, 3, 224, 224) and x.dtype == torch.float32
    assert x.min().item() >= 0.0 and x.max().item() <= 1.0
    assert x.std().item() > 0.1  # a real photo, not a blank


def test_load_image_round_trips_a_png(tmp_path):
    pixels = np.zeros((20, 30, 3), dtype=np.uint8)
    pixels[:, :15, 0] = 255  # left half red
    path = tmp_path / "half.png"
    Image.fromarray(pixels).save(path)
    x = load_image(path, size=16)
    assert x.shape == (1, 3, 16, 16)
    assert x[0, 0, :, :6].min().item() > 0.99 and x[0, 0, :, -6:].max().item() < 0.01
    assert x[0, 1].max().item() < 0.01


def test_load_image_converts_grey_to_rgb(tmp_path):
    path = tmp_path / "grey.jpg"
    Image.fromarray(np.full((10, 10), 128, dtype=np.uint8)).save(path)
    x = load_image(path, size=10)
    assert x.shape == (1, 3, 10, 10)
    assert torch.allclose(x[0, 0], x[0, 2])


def test_missing_file_error_names_the_file(tmp_path):
    path = tmp_path / "nope.png"
    with pytest.raises(FileNotFoundError, match=r"nope\.png"):
        load_image(path)


def test_unreadable_file_error_names_the_file(tmp_path):
    path = tmp_path / "notes.jpg"
    path.write_text("not an image")
    with pytest.raises(ValueError, match=r"notes\.jpg.*PNG or JPEG") as info:
        load_image(path)
    assert "\n" not in str(info.value)
