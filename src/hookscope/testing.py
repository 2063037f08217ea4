"""fastai's synthetic learner, for trying callbacks and testing them: ``synth_learner`` and ``synth_dbunch``.

Same names, keywords and meaning as ``fastai.test_utils``: a linear regression ``y = a*x + b + noise`` on
random data, fit by a two-parameter model with SGD (momentum 0.9) and the mean squared error. Every
example of the fastai callback article starts from it::

    from hookscope.testing import synth_learner
    from hookscope.callbacks import GradientClip

    learn = synth_learner()
    learn.fit(3, cbs=[GradientClip])
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hookscope.train.data import DataLoaders
from hookscope.train.learner import Learner

__all__ = ["RegModel", "synth_dbunch", "synth_learner"]


class RegModel(nn.Module):
    """``x * a + b`` with ``a`` and ``b`` scalar parameters drawn from a standard normal (fastai's)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.randn(1))
        self.b = nn.Parameter(torch.randn(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.a + self.b


def synth_dbunch(
    a: float = 2, b: float = 3, bs: int = 16, n_train: int = 10, n_valid: int = 2, cuda: bool = False
) -> DataLoaders:
    """``n_train`` shuffled training batches and ``n_valid`` validation batches of ``bs`` samples of
    ``y = a*x + b + 0.1*noise`` with ``x`` and the noise standard normal, both of shape ``(n, 1)``;
    ``cuda=True`` creates them on the GPU."""
    device = torch.device("cuda") if cuda else None

    def get_data(n: int) -> TensorDataset:
        x = torch.randn(bs * n, 1, device=device)
        return TensorDataset(x, a * x + b + 0.1 * torch.randn(bs * n, 1, device=device))

    train = DataLoader(get_data(n_train), batch_size=bs, shuffle=True)
    valid = DataLoader(get_data(n_valid), batch_size=bs)
    return DataLoaders(train, valid)


def synth_learner(
    n_trn: int = 10,
    n_val: int = 2,
    cuda: bool = False,
    lr: float = 1e-3,
    data: DataLoaders | None = None,
    model: nn.Module | None = None,
    **kwargs: Any,
) -> Learner:
    """A :class:`Learner` fitting a :class:`RegModel` to ``data`` (default: ``synth_dbunch`` with
    ``n_trn`` / ``n_val`` batches) with MSE and SGD at momentum 0.9; ``cuda=True`` trains on the GPU.

    ``kwargs`` go to the Learner (``cbs``, ``metrics``, ``opt_func``, ``progress``...).
    """
    if data is None:
        data = synth_dbunch(n_train=n_trn, n_valid=n_val, cuda=cuda)
    if model is None:
        model = RegModel()
    if cuda:
        kwargs.setdefault("device", "cuda")
    kwargs.setdefault("opt_func", partial(torch.optim.SGD, momentum=0.9))
    return Learner(model, data, nn.MSELoss(), lr=lr, **kwargs)
