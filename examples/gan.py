"""The smallest GAN with the seed article's pattern: the Learner trains the generator, a callback trains
the discriminator in ``after_batch``.

What it shows that ``cyclegan.py`` (the article's full CycleGAN trainer) does not: a callback that owns a
network *outside* the model — the discriminator and its optimizer live in ``DiscriminatorTrainer``, built
in ``__init__`` and returned by its ``state_dict``, so a checkpoint keeps them and ``learn.load`` gives them
back at once — while ``learn.opt`` stays the Learner's own. And 2-D points, so "the generator learned the
data" is one number you can check, the distance of its samples to the data's mean and spread.

Data: 2-D points from a Gaussian centred at (2, -1). The generator maps 2-D noise to points; its loss is
the discriminator being fooled. After each generator step, ``DiscriminatorTrainer.after_batch`` takes the
generator's output (``learn.pred``) and the real points (``learn.yb``) and makes one discriminator step with
its own optimizer. Both losses end up in ``learn.recorder.history`` (``train_loss``, and ``d_loss`` through
``learn.recorder.record``).

    python examples/gan.py
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import hookscope as hs

CENTRE, SPREAD = torch.tensor([2.0, -1.0]), 0.5


def mlp(n_in: int, n_out: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(n_in, 32), nn.LeakyReLU(0.2), nn.Linear(32, 32), nn.LeakyReLU(0.2), nn.Linear(32, n_out)
    )


class GeneratorLoss:
    """The generator wants the discriminator to call its points real."""

    def __init__(self, discriminator: nn.Module) -> None:
        self.discriminator = discriminator

    def __call__(self, fake: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        logits = self.discriminator(fake)
        return F.binary_cross_entropy_with_logits(logits, torch.ones_like(logits))


class DiscriminatorTrainer(hs.Callback):
    """One discriminator step after every generator step; its loss goes to the Recorder."""

    run_valid = False

    def __init__(self, discriminator: nn.Module, lr: float = 1e-3) -> None:
        self.discriminator = discriminator
        self.opt = torch.optim.Adam(discriminator.parameters(), lr=lr, betas=(0.5, 0.999))

    def before_fit(self) -> None:
        self.discriminator.to(self.learn.device)

    def after_batch(self) -> None:
        if self.learn.pred is None:
            return
        real, fake = self.learn.yb[0], self.learn.pred.detach()
        real_logits, fake_logits = self.discriminator(real), self.discriminator(fake)
        loss = F.binary_cross_entropy_with_logits(
            real_logits, torch.ones_like(real_logits)
        ) + F.binary_cross_entropy_with_logits(fake_logits, torch.zeros_like(fake_logits))
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.learn.recorder.record(d_loss=loss.detach())

    def state_dict(self) -> dict[str, Any]:
        """The discriminator and its optimizer: a checkpoint stores their states and gives them back."""
        return {"discriminator": self.discriminator, "opt": self.opt}


def distance_to_data(samples: torch.Tensor) -> float:
    """How far a sample is from the data distribution: error of its mean plus error of its spread."""
    mean_error = (samples.mean(0) - CENTRE).norm()
    spread_error = (samples.std(0) - SPREAD).abs().sum()
    return float(mean_error + spread_error)


def main(epochs: int = 30, n: int = 1024) -> tuple[hs.Learner, float, float]:
    """Train; returns the learner and the generator's distance to the data before and after."""
    torch.manual_seed(0)
    noise, real = torch.randn(n, 2), CENTRE + SPREAD * torch.randn(n, 2)
    train = DataLoader(TensorDataset(noise, real), batch_size=64, shuffle=True)
    generator, discriminator = mlp(2, 2), mlp(2, 1)
    probe = torch.randn(2048, 2)
    before = distance_to_data(generator(probe).detach())
    learn = hs.Learner(
        generator,
        hs.DataLoaders(train),
        GeneratorLoss(discriminator),
        opt_func=lambda params, lr: torch.optim.Adam(params, lr=lr, betas=(0.5, 0.999)),
        lr=1e-3,
        cbs=[DiscriminatorTrainer(discriminator)],
        progress=False,
    )
    learn.fit(epochs)
    after = distance_to_data(learn.predict(probe))
    last = learn.recorder.history[-1]
    print(f"generator loss {last['train_loss']:.3f}  discriminator loss {last['d_loss']:.3f}")
    print(f"distance of generated points to the data: {before:.3f} before, {after:.3f} after")
    return learn, before, after


if __name__ == "__main__":
    main()
