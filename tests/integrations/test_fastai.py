"""hookscope's fastai callback: the Learner holds it as learn.hookscope; one read per optimizer step."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from fastai.basics import DataLoaders, Learner, OptimWrapper
from fastai.callback.training import GradientAccumulation
from faults import dead_mlp, digits_flat
from torch import nn

from hookscope.integrations.fastai import HookscopeCallback

pytestmark = pytest.mark.usefixtures("deterministic")


def test_gradient_accumulation_reads_gradients_once_per_optimizer_step() -> None:
    torch.manual_seed(0)
    net = dead_mlp()
    loader = digits_flat().train  # 23 batches of 64: 11 optimizer steps of 128 samples
    learn = Learner(
        DataLoaders(loader, loader),
        net,
        loss_func=nn.CrossEntropyLoss(),
        opt_func=partial(OptimWrapper, opt=torch.optim.AdamW),
        lr=1e-3,
        cbs=[HookscopeCallback(quiet=True, check_every=3, every=1), GradientAccumulation(n_acc=128)],
    )
    with learn.no_bar(), learn.no_logging():
        learn.fit(1)
    watch = learn.hookscope.watch
    assert watch.step == 11
    assert {len(records) for records in watch.gradients.values()} == {11}
    (dead,) = [f for f in learn.hookscope.findings if f.kind == "dead_units"]
    assert (dead.module, dead.step) == ("3", 0)
    assert sum(len(m._forward_hooks) for m in net.modules()) == 0
