"""The same diagnosis whatever the loop: each fault of the catalogue (tests/faults.py), trained the same way
in the Learner, a plain loop under hs.watch, Lightning, fastai and HF's Trainer, gives the same finding —
kind, module name (no ``net.`` prefix from a wrapper) and step — and a healthy model gives no warning."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from faults import Branches, LogAct, SqrtAbs, dead_mlp, digits_flat, exploding_mlp, frozen_mlp, mlp
from loops import LOOPS
from torch import nn

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
}

_reference: dict[str, list] = {}


def findings_in(loop: str, fault: Fault, tmp_path) -> list:
    torch.manual_seed(0)
    model = fault.build()
    loader = digits_flat(**fault.data).train
    extra = {"out": str(tmp_path)} if loop == "transformers" else {}
    return LOOPS[loop](model, loader, fault.steps, fault.lr, fault.opt_func, **extra, **OPTIONS)


@pytest.mark.parametrize("fault", list(CATALOGUE))
@pytest.mark.parametrize("loop", list(LOOPS))
def test_every_loop_gives_the_learners_diagnosis(loop: str, fault: str, tmp_path) -> None:
    case = CATALOGUE[fault]
    found = findings_in(loop, case, tmp_path)
    if case.expected is None:
        assert [f for f in found if f.severity != "info"] == [], [str(f) for f in found]
        return
    kind, module = case.expected
    matching = [f for f in found if f.kind == kind]
    assert matching, f"{loop}: no {kind} finding in {[str(f) for f in found]}"
    assert matching[0].module == module
    if fault not in _reference:
        _reference[fault] = findings_in("learner", case, tmp_path)
    learner = next(f for f in _reference[fault] if f.kind == kind)
    assert matching[0].step == learner.step
    assert matching[0].evidence.get("phase") == learner.evidence.get("phase")  # NaN: forward or backward
