"""Plain training loops for the protocol checks, and :class:`Feed`, which feeds a ProtocolRecorder from
them the way ``hs.watch`` does: the optimizer's step pre-hook (gradients final) and post-hook (the step
happened, the batch ends, a check every ``check_every`` steps); the loop logs its loss and targets."""

from functools import cache

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hookscope.data.digits import digits_tensors
from hookscope.doctor.protocol import ProtocolRecorder


class Feed:
    def __init__(self, model, optimizer, check_every=5, start=0, state=None, **options):
        self.recorder = ProtocolRecorder(**options)
        if state is not None:
            self.recorder.load_state_dict(state)
        self.recorder.attach(model)
        self.recorder.watch_optimizer(optimizer)
        self.check_every, self.step, self.found = check_every, start, []
        self._handles = [
            optimizer.register_step_pre_hook(lambda *_: self.recorder.gradients_ready()),
            optimizer.register_step_post_hook(lambda *_: self._stepped()),
        ]
        self.recorder.begin_batch(start, training=True)

    def log(self, loss, target=None):
        self.recorder.log_loss(loss, training=torch.is_grad_enabled())
        if target is not None:
            self.recorder.log_target(target, training=torch.is_grad_enabled())

    def close(self):
        for handle in self._handles:
            handle.remove()
        self.recorder.close()
        self.found += self.recorder.findings()
        return self.found

    def abandon(self):
        """The process ends without a last check (a crash after a checkpoint): the findings so far."""
        for handle in self._handles:
            handle.remove()
        self.recorder.fail()
        return self.found

    def _stepped(self):
        self.recorder.step_done()
        self.recorder.end_batch()
        self.step += 1
        if self.step % self.check_every == 0:
            self.found += self.recorder.findings()
        self.recorder.begin_batch(self.step, training=True)


def cnn() -> nn.Sequential:
    """A small CNN for 1x8x8 digits with BatchNorm and dropout (both mode-dependent)."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Flatten(),
        nn.Dropout(0.2),
        nn.Linear(8 * 64, 10),
    )


@cache
def _digits():
    return digits_tensors()


def digits(shuffle=True, batch_size=64, sort=False, n=None) -> DataLoader:
    """The training digits (1x8x8), optionally sorted by label."""
    x, y, _, _ = _digits()
    if sort:
        order = torch.argsort(y, stable=True)
        x, y = x[order], y[order]
    if n is not None:
        x, y = x[:n], y[:n]
    generator = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=shuffle, generator=generator)


def valid_digits() -> DataLoader:
    _, _, x, y = _digits()
    return DataLoader(TensorDataset(x, y), batch_size=128)


def train(model, optimizer, feed, loader, steps, log_target=False, zero=True):
    """The textbook loop: zero_grad, forward, loss, backward, step, for ``steps`` steps."""
    loss_fn = nn.CrossEntropyLoss()
    done = 0
    while done < steps:
        for x, y in loader:
            if zero:
                optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            feed.log(loss, y if log_target else None)
            loss.backward()
            optimizer.step()
            done += 1
            if done == steps:
                return
