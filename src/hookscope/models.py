"""Small reference models used by the demo, the CLI, the tests and the benchmarks.

Plain ``nn.Module`` factories with readable qualified names (``features.0.0`` is the first conv,
``head.2`` the classifier), so hookscope's per-layer reports on them are easy to follow.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from itertools import pairwise

from torch import nn


def digits_cnn(num_classes: int = 10) -> nn.Sequential:
    """A small CNN for ``(N, 1, 8, 8)`` digits: three Conv-BN-ReLU blocks, global pooling, a linear head.

    Reaches >0.9 validation accuracy on :func:`hookscope.data.digits.digits_loaders` in two epochs
    with AdamW at lr 1e-3..3e-3. Global average pooling makes it accept upsampled digits too.
    """
    features = nn.Sequential(_conv_block(1, 32), _conv_block(32, 64), nn.MaxPool2d(2), _conv_block(64, 64))
    head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, num_classes))
    return nn.Sequential(OrderedDict(features=features, head=head))


def mlp(sizes: Sequence[int] = (32, 64, 10)) -> nn.Sequential:
    """A multilayer perceptron ``sizes[0] -> ... -> sizes[-1]`` with ReLU between the linear layers.

    The input is flattened first, so ``mlp((64, 128, 10))`` takes ``(N, 1, 8, 8)`` digits directly.
    """
    if len(sizes) < 2:
        raise ValueError(
            f"mlp: sizes={tuple(sizes)} needs at least an input and an output size, e.g. (64, 10)"
        )
    layers: list[nn.Module] = [nn.Flatten()]
    for i, (n_in, n_out) in enumerate(pairwise(sizes)):
        layers.append(nn.Linear(n_in, n_out))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def _conv_block(n_in: int, n_out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(n_in, n_out, kernel_size=3, padding=1, bias=False),
        nn.BatchNorm2d(n_out),
        nn.ReLU(),
    )
