"""The same diagnosis whatever the loop: each fault of the catalogue (tests/faults.py), trained the same way
in the Learner, a plain loop under hs.watch, Lightning, fastai and HF's Trainer, gives the same finding —
kind, module name (no ``net.`` prefix from a wrapper) and step — and a healthy model gives no warning.

The mistakes of the loop around the model (issue 24) are made the same way in every loop, through the
model, the data, the optimizer or a scheduler: where a loop cannot make one, ``not_in`` says why."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from faults import (
    Branches,
    KeepsOutputs,
    LogAct,
    SqrtAbs,
    StuckInEval,
    dead_mlp,
    digits_flat,
    digits_one_batch,
    digits_sorted,
    exploding_mlp,
    frozen_mlp,
    mlp,
    step_lr_per_batch,
    without_zero_grad,
)
from loops import LOOPS
from torch import nn

from hookscope.doctor.findings import ranked

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("deterministic")]

OPTIONS = {"quiet": True, "check_every": 3, "guard": True}


@dataclass(frozen=True)
class Fault:
    """A model with one injected fault, how it trains, and the finding it must give (None: healthy)."""

    build: Callable[[], nn.Module]
    expected: tuple[str, str] | None  # (kind, module)
    steps: int = 6
    lr: float = 1e-3
    opt_func: Callable[..., torch.optim.Optimizer] = torch.optim.AdamW
    data: dict[str, Any] = field(default_factory=dict)
    loader: Callable[..., Any] = digits_flat
    scheduler: Callable[[torch.optim.Optimizer], Any] | None = None
    not_in: dict[str, str] = field(default_factory=dict)  # loop -> why it cannot make this mistake


CATALOGUE = {
    "dead_units": Fault(dead_mlp, ("dead_units", "3")),
    "vanishing": Fault(lambda: mlp(depth=12, width=32, act=nn.Sigmoid), ("vanishing_gradient", "0")),
    "exploding": Fault(exploding_mlp, ("exploding_gradient", "7")),
    "saturation": Fault(
        lambda: nn.Sequential(nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 10)),
        ("saturation", "1"),
        data={"scale": 100.0},
    ),
    "forward_nan": Fault(
        lambda: nn.Sequential(nn.Linear(64, 32), LogAct(), nn.Linear(32, 10)), ("nonfinite", "1")
    ),
    "backward_nan": Fault(
        lambda: nn.Sequential(nn.Linear(64, 32, bias=False), SqrtAbs(), nn.Linear(32, 10)),
        ("nonfinite", "1"),
        data={"zero_row": 70},  # in the second batch
    ),
    "unused_branch": Fault(Branches, ("no_gradient", "unused")),
    "frozen": Fault(frozen_mlp, ("frozen", "0"), steps=4),
    "divergence": Fault(
        lambda: mlp(depth=3), ("loss_divergence", ""), steps=10, lr=10.0, opt_func=torch.optim.SGD
    ),
    "healthy": Fault(lambda: mlp(depth=3), None, steps=12),
    "zero_grad_missing": Fault(
        lambda: mlp(depth=3),
        ("stale_gradients", ""),
        lr=0.01,
        opt_func=without_zero_grad(torch.optim.SGD),
        not_in={
            "transformers": "the Trainer clears the gradients itself (`model.zero_grad()` after every "
            "step): its user cannot leave zero_grad out"
        },
    ),
    "eval_left_on": Fault(StuckInEval, ("train_in_eval_mode", "")),
    "same_batch_every_step": Fault(lambda: mlp(depth=3), ("repeated_batch", ""), loader=digits_one_batch),
    "sorted_labels": Fault(lambda: mlp(depth=3), ("unshuffled_data", ""), steps=12, loader=digits_sorted),
    "outputs_kept_with_graphs": Fault(KeepsOutputs, ("graph_kept_alive", ""), steps=12),
    "epoch_scheduler_per_batch": Fault(
        lambda: mlp(depth=3),
        ("lr_schedule", ""),
        steps=23,  # an epoch: the collapse at step 2 is within its first tenth
        scheduler=step_lr_per_batch,
        not_in={
            "fastai": "fastai drives the learning rate with its own ParamScheduler callbacks, not a torch "
            "scheduler; a torch scheduler would need a hand-written callback"
        },
    ),
}

_reference: dict[str, list] = {}


def findings_in(loop: str, fault: Fault, tmp_path) -> list:
    torch.manual_seed(0)
    model = fault.build()
    loader = fault.loader(**fault.data).train
    extra = {"out": str(tmp_path)} if loop == "transformers" else {}
    if fault.scheduler is not None:
        extra["scheduler"] = fault.scheduler
    return LOOPS[loop](model, loader, fault.steps, fault.lr, fault.opt_func, **extra, **OPTIONS)


@pytest.mark.parametrize("fault", list(CATALOGUE))
@pytest.mark.parametrize("loop", list(LOOPS))
def test_every_loop_gives_the_learners_diagnosis(loop: str, fault: str, tmp_path) -> None:
    case = CATALOGUE[fault]
    if loop in case.not_in:
        pytest.skip(f"{loop} cannot make this mistake: {case.not_in[loop]}")
    found = findings_in(loop, case, tmp_path)
    if case.expected is None:
        assert [f for f in found if f.severity != "info"] == [], [str(f) for f in found]
        return
    kind, module = case.expected
    # the most severe: the evidence before a hint of the same kind (the Learner's info that its loader
    # reads in order)
    matching = ranked(f for f in found if f.kind == kind)
    assert matching, f"{loop}: no {kind} finding in {[str(f) for f in found]}"
    assert matching[0].module == module
    if fault not in _reference:
        _reference[fault] = findings_in("learner", case, tmp_path)
    learner = ranked(f for f in _reference[fault] if f.kind == kind)[0]
    assert matching[0].step == learner.step
    assert matching[0].evidence.get("phase") == learner.evidence.get("phase")  # NaN: forward or backward
