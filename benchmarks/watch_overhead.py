"""Cost of the doctor in every loop: hs.watch and the integrations against the Learner's Doctor.

Three loops on the small CNN of ``stats_overhead.py`` (two 3x3 convs on 1x28x28, batch 64, AdamW at 1e-3,
in-memory tensors, one thread), each bare and watched with the same settings — every leaf module, statistics
every step (as ``wandb.watch(log_freq=1)``; the defaults record on the Doctor's sparse schedule), rules
every 10 steps, no guard:

- a hand-written loop: bare, under ``hs.watch(model, opt)``, and under ``wandb.watch(model, log="all",
  log_freq=1)`` in offline mode with ``wandb.log({"loss": ...})`` each step (what a W&B user writes);
- Lightning: bare ``Trainer`` and ``Trainer(callbacks=[HookscopeCallback()])``;
- fastai: bare ``Learner`` and with ``hookscope.integrations.fastai.HookscopeCallback()``;
- hookscope's Learner: bare and ``Doctor(guard=False)``.

Each run times its STEPS training steps (watch attached before, closed after: attaching and the last check
are not in the figure; the periodic checks are). Variants alternate; medians over rounds. The target: each
adapter's cost (watched / bare - 1 in its own loop) within 0.02 of the Doctor's.

    python benchmarks/watch_overhead.py [--quick] [--rounds N] [--clock cpu]

With ``--clock cpu`` W&B's own process and threads (which write the offline run) are not counted.
"""

from __future__ import annotations

import logging
import os
import tempfile
import warnings
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from common import CLOCKS, benchmark_args, format_table, median, paired_ratio, run_alternating
from stats_overhead import loaders, small_cnn

import hookscope as hs

LR = 1e-3
WATCH = {"every": 1, "check_every": 10, "quiet": True}  # the same settings for every adapter


def plain(steps: int, clock: Callable[[], float], watcher: str | None = None) -> float:
    """Seconds per step of a hand-written loop; ``watcher``: None, ``"hookscope"`` or ``"wandb"``."""
    model = small_cnn()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    train, _ = loaders(steps)
    batches = list(train)
    run, watch = None, None
    if watcher == "hookscope":
        watch = hs.watch(model, opt, **WATCH)
    elif watcher == "wandb":
        import wandb

        run = wandb.init(mode="offline", dir=tempfile.mkdtemp(), settings=wandb.Settings(silent=True))
        run.watch(model, log="all", log_freq=1)
    start = clock()
    for x, y in batches:
        loss = F.cross_entropy(model(x), y)
        if watch is not None:
            watch.log(loss)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if run is not None:
            run.log({"loss": loss.detach()})
    seconds = clock() - start
    if watch is not None:
        watch.close()
    if run is not None:
        run.finish()
    return seconds / steps


def train_phase_clock(base: type, clock: Callable[[], float]) -> Any:
    """A callback of ``base`` (hookscope's or fastai's: the same event names) that times the training
    phase; ``.seconds`` after the fit."""

    class Clock(base):
        order = -100

        def before_train(self) -> None:
            self.start = clock()

        def after_train(self) -> None:
            self.seconds = clock() - self.start

    return Clock()


def learner(steps: int, clock: Callable[[], float], doctor: bool) -> float:
    """Seconds per step of the Learner's training phase, bare or with ``Doctor(guard=False)``."""

    timer = train_phase_clock(hs.Callback, clock)
    cbs: list[hs.Callback] = [timer]
    if doctor:
        cbs.append(hs.callbacks.Doctor(guard=False, **WATCH))
    train, _ = loaders(steps)
    learn = hs.Learner(
        small_cnn(), (train, None), torch.nn.CrossEntropyLoss(), lr=LR, cbs=cbs, progress=False
    )
    learn.fit(1)
    return timer.seconds / steps


def lightning(steps: int, clock: Callable[[], float], watched: bool) -> float:
    """Seconds per step of Lightning's training epoch, bare or with hookscope's callback."""
    import lightning.pytorch as pl

    from hookscope.integrations.lightning import HookscopeCallback

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = small_cnn()

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=LR)

    class Clock(pl.Callback):
        def on_train_epoch_start(self, trainer, pl_module) -> None:
            self.start = clock()

        def on_train_epoch_end(self, trainer, pl_module) -> None:
            self.seconds = clock() - self.start

    timer = Clock()
    callbacks = [timer, HookscopeCallback(**WATCH)] if watched else [timer]
    trainer = pl.Trainer(
        max_epochs=1,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        callbacks=callbacks,
    )
    train, _ = loaders(steps)
    trainer.fit(Module(), train)
    return timer.seconds / steps


def fastai(steps: int, clock: Callable[[], float], watched: bool) -> float:
    """Seconds per step of fastai's training phase, bare or with hookscope's callback."""
    from fastai.basics import DataLoaders, Learner, OptimWrapper
    from fastai.callback.core import Callback

    from hookscope.integrations.fastai import HookscopeCallback

    timer = train_phase_clock(Callback, clock)
    train, valid = loaders(steps)
    learn = Learner(
        DataLoaders(train, valid),
        small_cnn(),
        loss_func=torch.nn.CrossEntropyLoss(),
        opt_func=partial(OptimWrapper, opt=torch.optim.AdamW),
        lr=LR,
        cbs=[timer, HookscopeCallback(**WATCH)] if watched else [timer],
    )
    with learn.no_logging(), learn.no_bar():
        learn.fit(1)
    return timer.seconds / steps


def main() -> None:
    args = benchmark_args(__doc__.splitlines()[0])
    steps, rounds = (6, 2) if args.quick else (100, args.rounds)
    torch.set_num_threads(1)
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_SILENT", "true")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="lightning")
    clock = CLOCKS[args.clock]
    variants = {
        "hand-written loop": partial(plain, steps, clock),
        "+ hs.watch": partial(plain, steps, clock, "hookscope"),
        "+ wandb.watch(log='all', log_freq=1)": partial(plain, steps, clock, "wandb"),
        "Lightning": partial(lightning, steps, clock, False),
        "+ HookscopeCallback (Lightning)": partial(lightning, steps, clock, True),
        "fastai": partial(fastai, steps, clock, False),
        "+ HookscopeCallback (fastai)": partial(fastai, steps, clock, True),
        "hookscope Learner": partial(learner, steps, clock, False),
        "+ Doctor(guard=False)": partial(learner, steps, clock, True),
    }
    for run in variants.values():  # warm-up: imports, allocator, kernels
        run()
    times = run_alternating(variants, rounds)
    per_step_us = {name: median(values) * 1e6 for name, values in times.items()}
    title = f"watch overhead: small CNN 1x28x28, batch 64, {steps} steps x {rounds} rounds, 1 thread"
    title += f", {args.clock} clock"
    print(format_table(title, per_step_us, "hand-written loop"))
    pairs = [
        ("+ hs.watch", "hand-written loop"),
        ("+ wandb.watch(log='all', log_freq=1)", "hand-written loop"),
        ("+ HookscopeCallback (Lightning)", "Lightning"),
        ("+ HookscopeCallback (fastai)", "fastai"),
        ("+ Doctor(guard=False)", "hookscope Learner"),
    ]
    costs = {name: paired_ratio(times, name, bare) - 1 for name, bare in pairs}
    doctor = costs["+ Doctor(guard=False)"]
    print("  cost over its own bare loop (median of per-round ratios - 1; added µs/step, median of rounds):")
    for (name, bare), cost in zip(pairs, costs.values(), strict=True):
        added = median([(a - b) * 1e6 for a, b in zip(times[name], times[bare], strict=True)])
        versus = "" if name.startswith("+ Doctor") else f"  {cost - doctor:+.3f} vs the Doctor's"
        print(f"    {name:<38} {cost:+.3f} ({added:+7.0f} µs) over {bare}{versus}")


if __name__ == "__main__":
    main()
