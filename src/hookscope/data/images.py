"""Images as model-ready tensors: scikit-learn's bundled ``china.jpg`` and any PNG/JPEG file.

Both return a float tensor ``(1, 3, size, size)`` in [0, 1], the input the seed articles feed a ResNet.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch.nn import functional as F

if TYPE_CHECKING:
    from PIL import Image


def sample_image(size: int = 224) -> torch.Tensor:
    """Return scikit-learn's bundled ``china.jpg`` resized to ``(1, 3, size, size)``, values in [0, 1]."""
    from sklearn.datasets import load_sample_image  # scikit-learn only when the sample is used

    return _to_tensor(load_sample_image("china.jpg"), size)


class ImageReadError(ValueError):
    """An image file that cannot be decoded; the message names the file."""


def read_rgb(path: str | Path) -> Image.Image:
    """Decode ``path`` as an RGB PIL image, or raise :class:`ImageReadError` naming the file and the cause."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except UnidentifiedImageError as err:
        # PIL's own message names an open file object (<_io.BufferedReader ...>) rather than the path.
        raise ImageReadError(f"cannot read {path} as an image (not a format PIL knows)") from err
    except OSError as err:
        raise ImageReadError(f"cannot read {path} as an image ({err})") from err


def load_image(path: str | Path, size: int = 224) -> torch.Tensor:
    """Read a PNG/JPEG file as ``(1, 3, size, size)`` in [0, 1] (grey and RGBA images become RGB)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"load_image: no image file at {path}; give the path of a PNG or JPEG file")
    try:
        pixels = np.asarray(read_rgb(path))
    except ImageReadError as err:
        raise ImageReadError(f"load_image: {err}; give a PNG or JPEG file") from err
    return _to_tensor(pixels, size)


def _to_tensor(pixels: np.ndarray, size: int) -> torch.Tensor:
    if size < 1:
        raise ValueError(f"image size={size} must be a positive number of pixels, e.g. 224")
    x = torch.tensor(pixels, dtype=torch.float32).permute(2, 0, 1).unsqueeze(0) / 255.0
    # Antialiasing keeps a downscaled photo faithful; the clamp absorbs float rounding at 0 and 1.
    x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
    return x.clamp_(0.0, 1.0)
