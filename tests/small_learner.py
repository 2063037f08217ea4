"""The tiny training setup the checkpoint tests share: an MLP with dropout on shuffled random data, so that
both the weights and every RNG stream matter to an exact resume (5 training batches per epoch)."""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hookscope as hs
from hookscope.train.events import CancelFitException


def tiny_learner(cbs=(), seed=0, in_memory=True, generator=None):
    data = torch.Generator().manual_seed(0)
    x, y = torch.randn(48, 6, generator=data), torch.randint(0, 3, (48,), generator=data)
    train = DataLoader(TensorDataset(x[:40], y[:40]), batch_size=8, shuffle=True, generator=generator)
    valid = DataLoader(TensorDataset(x[40:], y[40:]), batch_size=8)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.25), nn.Linear(16, 3))
    dls = hs.DataLoaders(train, valid, in_memory=in_memory)
    return hs.Learner(model, dls, nn.CrossEntropyLoss(), lr=1e-2, cbs=list(cbs), progress=False)


def weights(learn):
    return [p.detach().clone() for p in learn.model.parameters()]


class StopAtStep(hs.Callback):
    """Ends the fit after optimizer step ``step``, once a Checkpoint (order 90) has saved that batch."""

    order = 95

    def __init__(self, step):
        self.step = step

    def after_batch(self):
        if self.learn.training and self.learn.training_step == self.step:
            raise CancelFitException()
