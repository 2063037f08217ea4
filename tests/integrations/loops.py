"""One training run, five loops: the Learner, a plain loop under hs.watch, Lightning, fastai, HF's Trainer.

Each ``run_*`` trains ``model`` on ``loader``'s batches in order for ``steps`` optimizer steps with
``opt_func(params, lr=lr)`` and cross-entropy, with the doctor watching under ``options`` (those of
``hs.watch``), and returns the findings. ``scheduler``: a factory ``fn(optimizer)`` of a learning-rate
scheduler stepped after every optimizer step, the way each loop does it (fastai has none: its schedules are
its own callbacks). The plain loop gives the targets with ``w.log(loss, target=y)``. A NaN/Inf stopped by
the guard ends a run early, as in the Learner.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable
from functools import partial
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from faults import StopAfter
from torch import nn
from torch.utils.data import DataLoader, Dataset

import hookscope as hs
from hookscope.doctor.findings import Finding
from hookscope.watching import NonFiniteError

OptFunc = Callable[..., torch.optim.Optimizer]
SchedulerFactory = Callable[[torch.optim.Optimizer], Any] | None


def run_learner(
    model: nn.Module,
    loader: DataLoader,
    steps: int,
    lr: float,
    opt_func: OptFunc,
    scheduler: SchedulerFactory = None,
    **options: Any,
):
    """hookscope's Learner with its Doctor."""
    doctor = hs.callbacks.Doctor(**options)
    cbs = [doctor] + ([hs.callbacks.LRScheduler(scheduler, interval="step")] if scheduler else [])
    learn = hs.Learner(model, (loader, None), nn.CrossEntropyLoss(), opt_func, lr, cbs=cbs, progress=False)
    learn.fit(1, cbs=[StopAfter(steps)])
    return learn.doctor.findings


def run_plain(
    model: nn.Module,
    loader: DataLoader,
    steps: int,
    lr: float,
    opt_func: OptFunc,
    scheduler: SchedulerFactory = None,
    **options: Any,
):
    """A hand-written loop under ``hs.watch(model, opt)``."""
    opt = opt_func(model.parameters(), lr=lr)
    schedule = scheduler(opt) if scheduler else None
    with contextlib.suppress(NonFiniteError), hs.watch(model, opt, **options) as w:
        for x, y in itertools.islice(loader, steps):
            loss = F.cross_entropy(model(x), y)
            w.log(loss, target=y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            if schedule is not None:
                schedule.step()
    return w.findings


class LitClassifier(pl.LightningModule):
    """A LightningModule holding the user's network as ``self.net`` (findings name ``0``, not ``net.0``)."""

    def __init__(
        self,
        net: nn.Module,
        lr: float = 1e-3,
        opt_func: OptFunc = torch.optim.AdamW,
        scheduler: SchedulerFactory = None,
    ) -> None:
        super().__init__()
        self.net, self.lr, self.opt_func, self.scheduler = net, lr, opt_func, scheduler

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> Any:
        optimizer = self.opt_func(self.parameters(), lr=self.lr)
        if self.scheduler is None:
            return optimizer
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": self.scheduler(optimizer), "interval": "step"},
        }


def lightning_trainer(steps: int, callback: pl.Callback, **kwargs: Any) -> pl.Trainer:
    """A quiet CPU Trainer for ``steps`` optimizer steps."""
    settings = dict(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    return pl.Trainer(callbacks=[callback], **(settings | kwargs))


def run_lightning(
    model: nn.Module,
    loader: DataLoader,
    steps: int,
    lr: float,
    opt_func: OptFunc,
    scheduler: SchedulerFactory = None,
    **options: Any,
):
    """Lightning's Trainer with hookscope's callback."""
    from hookscope.integrations.lightning import HookscopeCallback

    callback = HookscopeCallback(**options)
    with contextlib.suppress(NonFiniteError):
        lightning_trainer(steps, callback).fit(LitClassifier(model, lr, opt_func, scheduler), loader)
    return callback.findings


def run_fastai(
    model: nn.Module, loader: DataLoader, steps: int, lr: float, opt_func: OptFunc, **options: Any
):
    """fastai's Learner with hookscope's callback."""
    from fastai.basics import CancelFitException, DataLoaders, Learner, OptimWrapper
    from fastai.callback.core import Callback

    from hookscope.integrations.fastai import HookscopeCallback

    class Stop(Callback):
        def after_batch(self) -> None:
            if self.learn.training and self.learn.train_iter >= steps:
                raise CancelFitException()

    callback = HookscopeCallback(**options)
    learn = Learner(
        DataLoaders(loader, loader),
        model,
        loss_func=nn.CrossEntropyLoss(),
        opt_func=partial(OptimWrapper, opt=opt_func),
        lr=lr,
        cbs=[callback, Stop()],
    )
    try:
        with learn.no_logging(), learn.no_bar(), contextlib.suppress(NonFiniteError):
            learn.fit(1)
    finally:
        callback.close()  # fastai fires no event when a fit raises
    return callback.findings


class WithLoss(nn.Module):
    """What HF's Trainer needs: a model whose forward returns the loss (the user's network is ``net``)."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.net(x)
        return {"loss": F.cross_entropy(logits, labels), "logits": logits}


class AsDicts(Dataset):
    """A ``(x, y)`` dataset as the ``{"x", "labels"}`` examples HF's default collator batches."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x, y = self.dataset[i]
        return {"x": x, "labels": y}


def hf_arguments(out: str, steps: int, batch_size: int, lr: float, **kwargs: Any):
    """TrainingArguments for a quiet CPU run in order, at a constant learning rate, saving nothing."""
    from transformers import TrainingArguments

    settings = dict(
        max_steps=steps,
        per_device_train_batch_size=batch_size,
        learning_rate=lr,
        lr_scheduler_type="constant",
        train_sampling_strategy="sequential",
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        use_cpu=True,
        remove_unused_columns=False,
    )
    return TrainingArguments(out, **(settings | kwargs))


def run_transformers(
    model: nn.Module,
    loader: DataLoader,
    steps: int,
    lr: float,
    opt_func: OptFunc,
    scheduler: SchedulerFactory = None,
    out: str = "",
    **options: Any,
):
    """Hugging Face's Trainer with hookscope's callback; no gradient clipping, as in the other loops."""
    from transformers import Trainer

    from hookscope.integrations.transformers import HookscopeCallback

    callback = HookscopeCallback(**options)
    wrapped = WithLoss(model)
    optimizer = opt_func(wrapped.parameters(), lr=lr)
    args = hf_arguments(out, steps, loader.batch_size, lr, max_grad_norm=0.0)
    trainer = Trainer(
        model=wrapped,
        args=args,
        train_dataset=AsDicts(loader.dataset),
        optimizers=(optimizer, scheduler(optimizer) if scheduler else None),
        callbacks=[callback],
    )
    try:
        with contextlib.suppress(NonFiniteError):
            trainer.train()
    finally:
        callback.close()  # the Trainer fires no event when training raises
    return callback.findings


LOOPS: dict[str, Callable[..., list[Finding]]] = {
    "learner": run_learner,
    "plain": run_plain,
    "lightning": run_lightning,
    "fastai": run_fastai,
    "transformers": run_transformers,
}
