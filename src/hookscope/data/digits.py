"""scikit-learn's bundled handwritten digits as tensors and DataLoaders (nothing is downloaded).

1797 grey 8×8 images of the digits 0–9: small enough to train on a laptop CPU in seconds, real enough
that a model has to learn. ``size`` > 8 upsamples them for CNNs that need larger inputs.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset


def digits_tensors(
    valid_pct: float = 0.2, seed: int = 0, size: int = 8
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return ``(x_train, y_train, x_valid, y_valid)``: x float32 ``(N, 1, size, size)``, y int64.

    The split is a seeded permutation (same ``seed``, same split). Pixels are normalised with the
    mean and std of the training images only, so nothing of the validation set leaks into training.
    """
    if not 0.0 < valid_pct < 1.0:
        raise ValueError(f"digits_tensors: valid_pct={valid_pct} must be strictly between 0 and 1")
    if size < 8:
        raise ValueError(f"digits_tensors: size={size} is below the native 8×8; use size >= 8")
    from sklearn.datasets import load_digits  # scikit-learn (1.5 s to import) only when the data is used

    bunch = load_digits()
    x = torch.as_tensor(bunch.images, dtype=torch.float32).unsqueeze(1)
    y = torch.as_tensor(bunch.target, dtype=torch.int64)
    if size > 8:
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    n_valid = round(len(x) * valid_pct)
    valid_idx, train_idx = order[:n_valid], order[n_valid:]
    x_train, x_valid = x[train_idx], x[valid_idx]
    mean, std = x_train.mean(), x_train.std()
    return (x_train - mean) / std, y[train_idx], (x_valid - mean) / std, y[valid_idx]


def digits_loaders(
    batch_size: int = 64, valid_pct: float = 0.2, seed: int = 0, size: int = 8
) -> tuple[DataLoader, DataLoader]:
    """Return ``(train_dl, valid_dl)`` over :func:`digits_tensors`; training order is shuffled by ``seed``."""
    x_train, y_train, x_valid, y_valid = digits_tensors(valid_pct=valid_pct, seed=seed, size=size)
    generator = torch.Generator().manual_seed(seed)
    train_dl = DataLoader(
        TensorDataset(x_train, y_train), batch_size=batch_size, shuffle=True, generator=generator
    )
    valid_dl = DataLoader(TensorDataset(x_valid, y_valid), batch_size=batch_size, shuffle=False)
    return train_dl, valid_dl
