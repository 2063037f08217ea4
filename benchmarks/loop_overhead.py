"""Per-step cost of a training loop on top of the model: hand-written vs hookscope, fastai, Lightning.

Two small models where loop overhead shows — an MLP (32 -> 64 -> 10) and a CNN (two convs on 1x28x28) —
batch 64, SGD, one thread. Each variant runs WARMUP + STEPS batches of one epoch and times the STEPS steps
after the warm-up (from the end of step WARMUP-1 to the end of the last step, so data loading is inside);
variants alternate, the median of the rounds is reported as µs per step and as a ratio to the hand-written
loop over the DataLoader. Usage: python benchmarks/loop_overhead.py [--quick] [--rounds N] [--clock cpu]
"""

from __future__ import annotations

import functools
import logging
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).parent))
from common import CLOCKS, benchmark_args, format_table, median, optional_import, run_alternating

import hookscope as hs

BATCH, LR = 64, 0.01


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))


def cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 10),
    )


class Setup:
    """One model family: its data (a shuffled DataLoader over tensors) and a fresh model per run."""

    def __init__(
        self,
        make_model: Callable[[], nn.Module],
        input_shape: tuple[int, ...],
        warmup: int,
        steps: int,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.make_model, self.warmup, self.steps, self.clock = make_model, warmup, steps, clock
        n = (warmup + steps) * BATCH
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, *input_shape, generator=generator)
        self.y = torch.randint(0, 10, (n,), generator=generator)
        self.valid = DataLoader(TensorDataset(self.x[:BATCH], self.y[:BATCH]), batch_size=BATCH)

    def loader(self) -> DataLoader:
        return DataLoader(TensorDataset(self.x, self.y), batch_size=BATCH, shuffle=True)

    def model_and_opt(self) -> tuple[nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = self.make_model()
        return model, torch.optim.SGD(model.parameters(), lr=LR)


class StepClock:
    """Marks the end of step ``warmup - 1`` and of the last step; ``seconds`` is the time between."""

    def __init__(self, setup: Setup) -> None:
        self.first, self.last = setup.warmup - 1, setup.warmup + setup.steps - 1
        self.clock = setup.clock
        self.start = self.end = 0.0

    def step_done(self, i: int) -> None:
        if i == self.first:
            self.start = self.clock()
        elif i == self.last:
            self.end = self.clock()

    @property
    def seconds(self) -> float:
        return self.end - self.start


def hand_written(setup: Setup, batches_of: Callable[[], object]) -> float:
    model, opt = setup.model_and_opt()
    loss_func = nn.CrossEntropyLoss()
    clock = StepClock(setup)
    for i, (x, y) in enumerate(batches_of()):
        loss = loss_func(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        clock.step_done(i)
    return clock.seconds


def hand_dataloader(setup: Setup) -> float:
    return hand_written(setup, setup.loader)


def hand_tensors(setup: Setup) -> float:
    loader = setup.loader()
    batches = [(x.clone(), y.clone()) for x, y in loader]
    return hand_written(setup, lambda: batches)


class HookscopeClock(hs.Callback):
    order = 1000

    def __init__(self, clock: StepClock) -> None:
        self.clock = clock

    def after_batch(self) -> None:
        if self.learn.training:
            self.clock.step_done(self.learn.iter)


def hookscope(setup: Setup, in_memory: bool, cost: bool = False) -> float:
    """``cost=True`` also attaches ``CallbackCost`` (every callback call timed) to show what it costs."""
    model, _ = setup.model_and_opt()
    clock = StepClock(setup)
    timing = [hs.callbacks.CallbackCost()] if cost else []
    dls = hs.DataLoaders(setup.loader(), setup.valid, in_memory=in_memory)
    learn = hs.Learner(
        model,
        dls,
        nn.CrossEntropyLoss(),
        opt_func=torch.optim.SGD,
        lr=LR,
        cbs=[HookscopeClock(clock), *timing],
        progress=False,
    )
    learn.fit(1)
    return clock.seconds


def fastai_variant(setup: Setup) -> float:
    from fastai.callback.core import Callback as FastaiCallback
    from fastai.data.core import DataLoaders as FastaiDataLoaders
    from fastai.learner import Learner as FastaiLearner
    from fastai.optimizer import OptimWrapper

    clock = StepClock(setup)

    class Clock(FastaiCallback):
        order = 1000

        def after_batch(self) -> None:
            if self.training:
                clock.step_done(self.iter)

    model, _ = setup.model_and_opt()
    dls = FastaiDataLoaders(setup.loader(), setup.valid)
    opt_func = functools.partial(OptimWrapper, opt=torch.optim.SGD)
    learn = FastaiLearner(
        dls, model, loss_func=nn.CrossEntropyLoss(), opt_func=opt_func, lr=LR, cbs=[Clock()]
    )
    with learn.no_logging():  # fastai.callback.progress is never imported here, so there is no bar
        learn.fit(1)
    return clock.seconds


def lightning_variant(setup: Setup, strategy: str = "auto", devices: int = 1) -> float:
    """Lightning's Trainer on one device (``strategy="ddp", devices=2`` under torchrun: ddp_overhead.py)."""
    import lightning as L

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)  # no GPU/TPU banners between rows
    clock = StepClock(setup)
    model, _ = setup.model_and_opt()

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model, self.loss_func = model, nn.CrossEntropyLoss()

        def training_step(self, batch, batch_idx):
            x, y = batch
            return self.loss_func(self.model(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=LR)

    class Clock(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            clock.step_done(batch_idx)

    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        strategy=strategy,
        devices=devices,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=[Clock()],
    )
    trainer.fit(Module(), train_dataloaders=setup.loader())
    return clock.seconds


def measure(title: str, setup: Setup, rounds: int) -> str:
    variants: dict[str, Callable[[], float]] = {
        "hand-written, DataLoader": lambda: hand_dataloader(setup),
        "hand-written, pre-batched tensors": lambda: hand_tensors(setup),
        "hookscope (in_memory=False)": lambda: hookscope(setup, in_memory=False),
        "hookscope (in-memory fast path)": lambda: hookscope(setup, in_memory=True),
        "hookscope (fast path + CallbackCost)": lambda: hookscope(setup, in_memory=True, cost=True),
    }
    skipped: dict[str, str] = {}
    for name, module, variant in (
        ("fastai (bar off)", "fastai.learner", fastai_variant),
        ("Lightning (bar/logger/ckpt off)", "lightning", lightning_variant),
    ):
        found, reason = optional_import(module)
        if found is None:
            skipped[name] = reason
        else:
            variants[name] = functools.partial(variant, setup)
    times = run_alternating(variants, rounds)
    per_step = {name: median(t) / setup.steps * 1e6 for name, t in times.items()}
    return format_table(title, per_step, baseline="hand-written, DataLoader", skipped=skipped)


def main() -> None:
    args = benchmark_args(__doc__.splitlines()[0])
    warnings.filterwarnings("ignore", category=FutureWarning)  # peers' deprecation notices
    torch.set_num_threads(1)
    warmup, steps, rounds = (5, 30, 1) if args.quick else (30, 300, args.rounds)
    print(
        f"torch {torch.__version__}, 1 thread, batch {BATCH}, {steps} steps after {warmup} warm-up, "
        f"median of {rounds}, {args.clock} clock"
    )
    clock = CLOCKS[args.clock]
    print(measure("MLP 32-64-10", Setup(mlp, (32,), warmup, steps, clock), rounds))
    print(measure("CNN 2 convs, 1x28x28", Setup(cnn, (1, 28, 28), warmup, steps, clock), rounds))


if __name__ == "__main__":
    main()
