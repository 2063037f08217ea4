"""The seed article's first callback: print the number of trainable parameters before training starts.

A callback is a plain class with methods named after events; ``before_fit`` runs once, before the first
epoch, and reads the model through ``self.learn``. Trained here on a synthetic linear regression
(y = 2x + 1 plus noise), like fastai's ``synth_learner``.

    python examples/count_params.py
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hookscope as hs


class CountParamCallback(hs.Callback):
    def before_fit(self) -> None:
        print("Num param:", self.count_parameters(self.learn.model))

    def count_parameters(self, model: nn.Module) -> int:
        return sum(p.numel() for p in model.parameters() if p.requires_grad)


def synth_learner(cbs: list[hs.Callback], n: int = 256) -> hs.Learner:
    """A Learner on y = 2x + 1 + noise with a one-weight, one-bias linear model."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, 1, generator=generator)
    y = 2 * x + 1 + 0.1 * torch.randn(n, 1, generator=generator)
    train = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, generator=generator)
    valid = DataLoader(TensorDataset(x[:64], y[:64]), batch_size=64)
    torch.manual_seed(0)
    return hs.Learner(nn.Linear(1, 1), (train, valid), nn.MSELoss(), lr=0.1, cbs=cbs, progress=False)


def main() -> hs.Learner:
    learn = synth_learner(cbs=[CountParamCallback()])
    learn.fit(2)
    return learn


if __name__ == "__main__":
    main()
