"""Train a tiny MLP (dropout, shuffled batches, one-cycle schedule) with a Checkpoint callback.

Run as a subprocess by tests/callbacks/test_checkpoint.py: it can kill itself with SIGKILL (what
``kill -9`` does) or send itself SIGINT (what Ctrl-C does) at a chosen step and event, resume from the
checkpoint folder, and export the final weights as safetensors for a bitwise comparison.
"""

from __future__ import annotations

import argparse
import os
import signal

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hookscope as hs

N_EPOCH = 3
BATCHES_PER_EPOCH = 7  # 64 samples, batch size 10, last batch of 4 kept


class SignalAt(hs.Callback):
    """Send ``sig`` to this process at training step ``step`` during ``event``."""

    order = 100  # after the Checkpoint callback, so an after_batch signal comes once the step is saved

    def __init__(self, step: int, event: str, sig: signal.Signals) -> None:
        self.step, self.event, self.sig = step, event, sig

    def after_pred(self) -> None:
        self._maybe("after_pred", self.learn.training_step + 1)

    def after_backward(self) -> None:
        self._maybe("after_backward", self.learn.training_step + 1)

    def after_step(self) -> None:
        self._maybe("after_step", self.learn.training_step)

    def after_batch(self) -> None:
        self._maybe("after_batch", self.learn.training_step)

    def _maybe(self, event: str, step: int) -> None:
        if self.learn.training and event == self.event and step == self.step:
            os.kill(os.getpid(), self.sig)


def make_learner(folder: str, in_memory: bool, cbs: list[hs.Callback]) -> hs.Learner:
    data = torch.Generator().manual_seed(0)
    x = torch.randn(96, 8, generator=data)
    y = torch.randint(0, 3, (96,), generator=data)
    train = DataLoader(TensorDataset(x[:64], y[:64]), batch_size=10, shuffle=True)
    valid = DataLoader(TensorDataset(x[64:], y[64:]), batch_size=16)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 3))
    checkpoint = hs.callbacks.Checkpoint(folder, every_n_steps=1, keep_last=2)
    return hs.Learner(
        model,
        hs.DataLoaders(train, valid, in_memory=in_memory),
        nn.CrossEntropyLoss(),
        cbs=[checkpoint, *cbs],
        progress=False,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder")
    parser.add_argument("--out", required=True, help="safetensors file for the final weights")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--plain-loader", action="store_true", help="turn off the in-memory fast path")
    parser.add_argument("--signal", choices=("KILL", "INT"), default=None)
    parser.add_argument("--step", type=int, default=0)
    parser.add_argument("--event", default="after_batch")
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(1234)  # the resumed run starts from other RNG states: the checkpoint must restore them
    if args.resume:
        torch.manual_seed(99)
    cbs = [SignalAt(args.step, args.event, signal.Signals[f"SIG{args.signal}"])] if args.signal else []
    learn = make_learner(args.folder, not args.plain_loader, cbs)
    learn.fit_one_cycle(N_EPOCH, lr_max=0.05, resume="last" if args.resume else None)
    hs.export_safetensors(learn.model, args.out)


if __name__ == "__main__":
    main()
