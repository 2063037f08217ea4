"""hookscope's Lightning callback: bf16 and gradient accumulation, the user's names, the Trainer's logger."""

from __future__ import annotations

import csv
import json
from typing import Any

import pytest
import torch
from faults import dead_mlp, digits_flat
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.plugins import MixedPrecision
from loops import LitClassifier, lightning_trainer
from torch import nn

from hookscope.integrations.lightning import HookscopeCallback

pytestmark = pytest.mark.usefixtures("deterministic")


def dead_net() -> torch.nn.Module:
    torch.manual_seed(0)
    return dead_mlp()


def hooks_left(model: torch.nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def test_bf16_with_accumulation_reads_gradients_once_per_optimizer_step_and_logs(tmp_path) -> None:
    net = dead_net()
    callback = HookscopeCallback(quiet=True, check_every=3)
    trainer = lightning_trainer(
        6, callback, precision="bf16-mixed", accumulate_grad_batches=2, logger=CSVLogger(tmp_path)
    )
    trainer.fit(LitClassifier(net), digits_flat().train)  # 12 batches, 6 optimizer steps
    assert callback.watch.step == trainer.global_step == 6
    # the warm-up's 5 optimizer steps recorded, once each (the dead units are found at once: no suspicion)
    assert [len(records) for records in callback.watch.gradients.values()] == [5] * len(
        callback.watch.gradients
    )
    (dead,) = [f for f in callback.findings if f.kind == "dead_units"]
    assert (dead.module, dead.step) == ("3", 0)  # the net's own name, not net.3
    assert set(callback.watch.activations) >= {"0", "1", "2", "3", "4"}
    rows = list(csv.DictReader(next(tmp_path.glob("**/metrics.csv")).open()))
    logged = [
        (row["step"], row["hookscope/findings/dead_units"]) for row in rows if row.get("hookscope/findings")
    ]
    # after each check in the fit (after 3 steps, and at the 5-step warm-up's end), at the Trainer's step
    assert logged == [("3", "1.0"), ("5", "1.0")]
    assert hooks_left(net) == 0


def test_an_explicit_model_names_findings_from_there() -> None:
    net = dead_net()
    lit = LitClassifier(net)
    callback = HookscopeCallback(model=lit, quiet=True, check_every=3)
    lightning_trainer(3, callback).fit(lit, digits_flat().train)
    assert [f.module for f in callback.findings if f.kind == "dead_units"] == ["net.3"]


def test_a_second_fit_watches_again_with_one_set_of_hooks() -> None:
    net = dead_net()
    callback = HookscopeCallback(quiet=True, check_every=3)
    for _ in range(2):
        lightning_trainer(3, callback).fit(LitClassifier(net), digits_flat().train)
        assert callback.watch.step == 3 and hooks_left(net) == 0


def test_report_writes_the_run_folder_of_the_fit(tmp_path) -> None:
    callback = HookscopeCallback(quiet=True, check_every=3, path=tmp_path / "run")
    lightning_trainer(3, callback).fit(LitClassifier(dead_net()), digits_flat().train)
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert (config["status"], config["steps"]) == ("complete", 3)
    assert "layer `3` — 100% of units dead" in (tmp_path / "run" / "report.html").read_text()


class InfGradientOnSecondBackward(torch.autograd.Function):
    """Identity; the second backward through it returns an infinite gradient (a float16 overflow)."""

    calls = 0

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        InfGradientOnSecondBackward.calls += 1
        return grad * float("inf") if InfGradientOnSecondBackward.calls == 2 else grad


class OverflowOnce(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return InfGradientOnSecondBackward.apply(x)


def test_fp16_gradients_are_read_unscaled_and_the_step_the_scaler_skips_is_not_counted() -> None:
    InfGradientOnSecondBackward.calls = 0
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 32), OverflowOnce(), nn.ReLU(), nn.Linear(32, 10))
    callback = HookscopeCallback(quiet=True, check_every=3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)  # Lightning's CPU 16-mixed has no scaler
    trainer = lightning_trainer(4, callback, plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)])
    trainer.fit(LitClassifier(net), digits_flat().train)
    assert (trainer.global_step, callback.watch.step) == (4, 3)  # Lightning counts the skipped step
    records = callback.watch.param_history["0.weight"]
    assert [r.step for r in records] == [0, 1, 2]
    assert all(0 < r.grad_norm < 10 for r in records)  # scaled by 2**16 they would be > 1e4
