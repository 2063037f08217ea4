"""Small models with one injected fault each, and the digits data they train on (shared by the tests)."""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hookscope as hs
from hookscope.data.digits import digits_tensors
from hookscope.train.events import CancelFitException


def digits_flat(scale: float = 1.0, zero_row: int | None = None) -> hs.DataLoaders:
    """Flattened 8x8 digits (64 features) in a fixed order, batches of 64."""
    x, y, _, _ = digits_tensors()
    x = x.flatten(1) * scale
    if zero_row is not None:
        x[zero_row] = 0.0
    return hs.DataLoaders(DataLoader(TensorDataset(x, y), batch_size=64), None)


def mlp(depth: int, width: int = 64, act: type[nn.Module] = nn.ReLU) -> nn.Sequential:
    """``depth`` Linear layers (64 -> width ... -> 10) with ``act`` between them."""
    layers: list[nn.Module] = [nn.Linear(64, width), act()]
    for _ in range(depth - 2):
        layers += [nn.Linear(width, width), act()]
    layers.append(nn.Linear(width, 10))
    return nn.Sequential(*layers)


class LogAct(nn.Module):
    """log(x): NaN for the negative half of its inputs."""

    def forward(self, x):
        return torch.log(x)


class SqrtAbs(nn.Module):
    """|x| as sqrt(x*x): finite forward, infinite derivative where x == 0."""

    def forward(self, x):
        return torch.sqrt(x * x)


class Branches(nn.Module):
    """``unused`` never runs; ``aux`` runs but its output is detached before the loss."""

    def __init__(self):
        super().__init__()
        self.body = nn.Linear(64, 10)
        self.unused = nn.Linear(64, 10)
        self.aux = nn.Linear(64, 10)

    def forward(self, x):
        return self.body(x) + 0.0 * self.aux(x).detach()


class StopAfter(hs.Callback):
    def __init__(self, steps: int):
        self.steps = steps

    def after_batch(self):
        if self.learn.training and self.learn.training_step >= self.steps:
            raise CancelFitException()


def train_with_doctor(
    model, dls=None, steps=12, lr=1e-3, opt_func=torch.optim.AdamW, epochs=1, cbs=(), **doctor_kw
):
    """Fit ``model`` for at most ``epochs`` epochs and ``steps`` steps with a quiet Doctor (and ``cbs``);
    returns the Learner."""
    doctor = hs.callbacks.Doctor(quiet=True, check_every=3, **doctor_kw)
    learn = hs.Learner(
        model,
        dls or digits_flat(),
        nn.CrossEntropyLoss(),
        opt_func=opt_func,
        lr=lr,
        cbs=[doctor],
        progress=False,
    )
    learn.fit(epochs, cbs=[StopAfter(steps), *cbs])
    return learn


def kinds(learn) -> dict[str, list]:
    found: dict[str, list] = {}
    for f in learn.doctor.findings:
        found.setdefault(f.kind, []).append(f)
    return found


class BatchMixingView(nn.Module):
    """``view`` where a transpose was meant: (N, C) read as (C, N) and transposed back mixes the samples."""

    def forward(self, x):
        return x.view(x.shape[1], x.shape[0]).t()


class MixesInForward(nn.Module):
    """The batch-mixing bug in a model's own forward: the batch and channel dimensions swapped before a
    flatten, between ``body`` and ``head``."""

    def __init__(self):
        super().__init__()
        self.body = nn.Conv2d(1, 4, 3, padding=1)
        self.head = nn.Linear(4 * 8 * 8, 10)

    def forward(self, x):
        h = torch.relu(self.body(x))
        return self.head(h.transpose(0, 1).reshape(h.shape[0], -1))


def digits_raw_pixels() -> tuple[torch.Tensor, torch.Tensor]:
    """The digits as raw 0-255 grey levels (N, 64), never normalised, and their labels."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = torch.as_tensor(bunch.data, dtype=torch.float32) * 255 / 16
    return x.round(), torch.as_tensor(bunch.target)


def optimizer_without(skipped: nn.Module, opt_func=torch.optim.AdamW):
    """An ``opt_func`` that leaves the parameters of ``skipped`` out of the optimizer (a layer added to
    the model after the optimizer was built)."""
    left_out = {id(p) for p in skipped.parameters()}

    def make(params, lr):
        return opt_func([p for p in params if id(p) not in left_out], lr=lr)

    return make


def tiny_train_digits(n: int = 32) -> hs.DataLoaders:
    """``n`` flattened training digits in one batch, and the whole validation split: a model memorises
    them within a few epochs while the validation loss climbs."""
    x, y, x_valid, y_valid = digits_tensors()
    train = DataLoader(TensorDataset(x[:n].flatten(1), y[:n]), batch_size=n)
    return hs.DataLoaders(train, DataLoader(TensorDataset(x_valid.flatten(1), y_valid), batch_size=512))


def dead_mlp() -> nn.Sequential:
    """A 3-layer MLP whose middle ReLU (``3``) is dead: the bias before it (``2``) is -10."""
    model = mlp(depth=3)
    with torch.no_grad():
        model[2].bias.fill_(-10.0)
    return model


def exploding_mlp() -> nn.Sequential:
    """An 8-layer MLP with every weight scaled 10x: the gradient grows layer after layer."""
    model = mlp(depth=8)
    with torch.no_grad():
        for layer in model:
            if isinstance(layer, nn.Linear):
                layer.weight.mul_(10.0)
    return model


def frozen_mlp() -> nn.Sequential:
    """A 3-layer MLP whose first layer (``0``) is frozen."""
    model = mlp(depth=3)
    model[0].requires_grad_(False)
    return model


# ---- mistakes of the loop around the model (issue 24): expressed through the model, data or optimizer,
# so that every loop makes the same mistake ---------------------------------------------------------------


def digits_sorted() -> hs.DataLoaders:
    """The flattened training digits sorted by label, never shuffled: batches of one class after another."""
    x, y, _, _ = digits_tensors()
    order = torch.argsort(y, stable=True)
    return hs.DataLoaders(DataLoader(TensorDataset(x.flatten(1)[order], y[order]), batch_size=64), None)


def digits_one_batch() -> hs.DataLoaders:
    """The first 64 flattened digits over and over: every batch is the same (`next(iter(loader))` inside
    the loop)."""
    x, y, _, _ = digits_tensors()
    x, y = x.flatten(1)[:64].repeat(23, 1), y[:64].repeat(23)
    return hs.DataLoaders(DataLoader(TensorDataset(x, y), batch_size=64), None)


def dropout_mlp() -> nn.Sequential:
    """A 3-layer MLP with dropout (a mode-dependent module)."""
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 10))


class StuckInEval(nn.Module):
    """`model.eval()` left on: a dropout MLP that stays in eval mode whatever the loop asks (every loop
    calls `model.train()` before training; this one ignores it)."""

    def __init__(self):
        super().__init__()
        self.net = dropout_mlp()
        self.eval()

    def train(self, mode: bool = True):
        return super().train(False)

    def forward(self, x):
        return self.net(x)


class KeepsOutputs(nn.Module):
    """A list of predictions that still require grad: every forward's output is kept, graph and all."""

    def __init__(self):
        super().__init__()
        self.net = mlp(depth=3)
        self.kept: list[torch.Tensor] = []

    def forward(self, x):
        out = self.net(x)
        self.kept.append(out)
        return out


def without_zero_grad(opt_func=torch.optim.SGD):
    """An ``opt_func`` whose optimizer's ``zero_grad`` does nothing: `optimizer.zero_grad()` missing."""

    def make(params, lr):
        optimizer = opt_func(params, lr=lr)
        optimizer.zero_grad = lambda set_to_none=True: None
        return optimizer

    return make


def step_lr_per_batch(optimizer):
    """A StepLR built for epochs (a tenfold decay every epoch, here a hundredfold) stepped after every
    batch: the learning rate collapses within a few steps."""
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.01)
