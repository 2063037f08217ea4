"""What a tracker costs a training run: hookscope's TensorBoard, W&B and MLflow callbacks, and the peers.

The small CNN of ``loop_overhead.py`` (two convs on 1x28x28, batch 64, SGD, one thread), one epoch of
WARMUP + STEPS batches. Two figures per variant, medians over alternating rounds:

- per step: the STEPS steps after the warm-up (as ``loop_overhead.py`` times them), i.e. what a tracker
  adds while training at its default rate — loss points, reads every 100 steps, the writes;
- per fit: the whole ``fit``, including starting the tracker (W&B starts its service process, MLflow
  creates its SQLite schema) and what it writes at the end (predictions table, model artifact).

hookscope's variants at default settings, against the bare Learner; fastai with its ``WandbCallback`` /
``TensorBoardCallback`` against a bare fastai Learner, Lightning with its ``TensorBoardLogger`` (and
``self.log("train_loss", ...)`` every step, logged every 50 steps by default) against Lightning without a
logger. Everything writes into a temporary folder; W&B is offline. Usage:
python benchmarks/tracker_overhead.py [--quick] [--rounds N] [--clock wall|cpu] (cpu misses the trackers'
own threads and processes: report wall).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from common import CLOCKS, benchmark_args, median, optional_import, paired_ratio, run_alternating
from loop_overhead import LR, HookscopeClock, Setup, StepClock, cnn

import hookscope as hs


@contextlib.contextmanager
def scratch() -> Iterator[Path]:
    """A fresh temporary working directory for one run (the trackers' default places), removed after."""
    here = Path.cwd()
    with tempfile.TemporaryDirectory(prefix="tracker-bench-") as folder:
        os.chdir(folder)
        try:
            yield Path(folder)
        finally:
            os.chdir(here)


def timed(run: Callable[[Setup, StepClock], None], setup: Setup) -> tuple[float, float]:
    """``(seconds of the timed steps, seconds of the whole fit)`` of one run in a scratch folder."""
    clock = StepClock(setup)
    with scratch():
        start = time.perf_counter()
        run(setup, clock)
        return clock.seconds, time.perf_counter() - start


def hookscope_run(trackers: Callable[[], list[hs.Callback]], setup: Setup, clock: StepClock) -> None:
    model, _ = setup.model_and_opt()
    dls = hs.DataLoaders(setup.loader(), setup.valid)
    cbs = [HookscopeClock(clock), *trackers()]
    learn = hs.Learner(
        model, dls, nn.CrossEntropyLoss(), opt_func=torch.optim.SGD, lr=LR, cbs=cbs, progress=False
    )
    learn.fit(1)


TRACKERS: dict[str, Callable[[], list[hs.Callback]]] = {
    "hookscope": list,
    "hookscope + TensorBoardCallback": lambda: [hs.callbacks.TensorBoardCallback()],
    "hookscope + WandbCallback": lambda: [hs.callbacks.WandbCallback()],
    "hookscope + MLflowCallback": lambda: [hs.callbacks.MLflowCallback()],
    "hookscope + all three": lambda: [
        hs.callbacks.TensorBoardCallback(),
        hs.callbacks.WandbCallback(),
        hs.callbacks.MLflowCallback(),
    ],
}


def fastai_run(tracker: str | None, setup: Setup, clock: StepClock) -> None:
    from fastai.callback.core import Callback as FastaiCallback
    from fastai.data.core import DataLoaders as FastaiDataLoaders
    from fastai.learner import Learner as FastaiLearner
    from fastai.optimizer import SGD

    class Clock(FastaiCallback):
        order = 1000

        def after_batch(self) -> None:
            if self.training:
                clock.step_done(self.iter)

    cbs: list[FastaiCallback] = [Clock()]
    run = None
    if tracker == "wandb":
        import wandb
        from fastai.callback.wandb import WandbCallback

        run = wandb.init(project="bench", dir=".", mode="offline", settings=wandb.Settings(silent=True))
        cbs.append(WandbCallback(log_preds=False))  # fastai's predictions need its own DataBlock loaders
    elif tracker == "tensorboard":
        from fastai.callback.tensorboard import TensorBoardCallback

        cbs.append(TensorBoardCallback(trace_model=False, log_preds=False))
    model, _ = setup.model_and_opt()
    dls = FastaiDataLoaders(setup.loader(), setup.valid)
    learn = FastaiLearner(dls, model, loss_func=nn.CrossEntropyLoss(), opt_func=SGD, lr=LR, cbs=cbs)
    with learn.no_bar(), learn.no_logging():
        learn.fit(1)
    if run is not None:
        run.finish()


def lightning_run(tensorboard: bool, setup: Setup, clock: StepClock) -> None:
    import lightning as L
    from lightning.pytorch.loggers import TensorBoardLogger

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    model, _ = setup.model_and_opt()

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model, self.loss_func = model, nn.CrossEntropyLoss()

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = self.loss_func(self.model(x), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=LR)

    class Clock(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            clock.step_done(batch_idx)

    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        devices=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=TensorBoardLogger(".") if tensorboard else False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=[Clock()],
    )
    trainer.fit(Module(), train_dataloaders=setup.loader())


def variants(setup: Setup) -> tuple[dict[str, Callable[[], tuple[float, float]]], dict[str, str]]:
    """Every variant that can run here, and the peers that cannot (with the reason)."""
    runs = {name: functools.partial(hookscope_run, make) for name, make in TRACKERS.items()}
    peers = {
        "fastai": ("fastai.learner", functools.partial(fastai_run, None)),
        "fastai + WandbCallback": ("fastai.callback.wandb", functools.partial(fastai_run, "wandb")),
        "fastai + TensorBoardCallback": (
            "fastai.callback.tensorboard",
            functools.partial(fastai_run, "tensorboard"),
        ),
        "Lightning": ("lightning", functools.partial(lightning_run, False)),
        "Lightning + TensorBoardLogger": ("lightning", functools.partial(lightning_run, True)),
    }
    found: dict[str, Callable[[], tuple[float, float]]] = {}
    skipped: dict[str, str] = {}
    for name, (module, run) in peers.items():
        imported, reason = optional_import(module)
        if imported is None:
            skipped[name] = reason
        else:
            runs[name] = run
    for name, run in runs.items():
        try:  # one untimed run: imports and caches warm up; a variant that cannot train is reported
            timed(run, setup)
        except Exception as err:
            skipped[name] = f"fails: {type(err).__name__}: {' '.join(str(err).split())[:90]}"
            continue
        found[name] = functools.partial(timed, run, setup)
    return found, skipped


BASELINES = {"hookscope": "hookscope", "fastai": "fastai", "Lightning": "Lightning"}


def table(results: dict[str, list[tuple[float, float]]], steps: int, skipped: dict[str, str]) -> str:
    """µs per step and seconds per fit, each with its ratio to the same framework without a tracker."""
    per_step = {name: [s for s, _ in runs] for name, runs in results.items()}
    per_fit = {name: [f for _, f in runs] for name, runs in results.items()}
    lines = [f"  {'variant':<34}{'µs/step':>9}{'ratio':>8}{'s/fit':>8}{'ratio':>8}"]
    for name in results:
        base = BASELINES[name.split(" + ")[0]]
        lines.append(
            f"  {name:<34}{median(per_step[name]) / steps * 1e6:>9.1f}"
            f"{paired_ratio(per_step, name, base):>7.3f}x"
            f"{median(per_fit[name]):>8.2f}{paired_ratio(per_fit, name, base):>7.2f}x"
        )
    lines += [f"  {name:<34}skipped: {reason}" for name, reason in skipped.items()]
    return "\n".join(lines)


def main() -> None:
    args = benchmark_args(__doc__.splitlines()[0])
    warnings.filterwarnings("ignore")  # peers' deprecation notices between the rows
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_SILENT", "true")
    with tempfile.TemporaryDirectory(prefix="tracker-bench-home-") as home:
        for name in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_CONFIG_DIR"):
            os.environ[name] = home
        torch.set_num_threads(1)
        warmup, steps, rounds = (5, 30, 1) if args.quick else (20, 300, args.rounds)
        setup = Setup(cnn, (1, 28, 28), warmup, steps, CLOCKS[args.clock])
        print(
            f"torch {torch.__version__}, 1 thread, CNN 2 convs 1x28x28, batch 64, {steps} steps after "
            f"{warmup} warm-up, median of {rounds} rounds, {args.clock} clock"
        )
        found, skipped = variants(setup)
        print(table(run_alternating(found, rounds), steps, skipped))


if __name__ == "__main__":
    main()
