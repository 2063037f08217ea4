"""What the three integrations share: the module they watch, their options, their install hint."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from faults import SqrtAbs
from torch import nn

from hookscope.integrations._common import StepSeen, WatchCallback, user_model


class Holder(nn.Module):
    """A wrapper as frameworks want them: the user's network, a loss module, maybe parameters of its own."""

    def __init__(self, net: nn.Module, own: bool = False) -> None:
        super().__init__()
        self.net = net
        self.loss_func = nn.CrossEntropyLoss()
        self.scale = nn.Parameter(torch.ones(())) if own else None


def test_the_users_model_is_the_only_child_holding_parameters() -> None:
    net = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    assert user_model(Holder(net)) is net


def test_a_wrapper_with_parameters_of_its_own_or_two_networks_is_watched_whole() -> None:
    net = nn.Linear(4, 4)
    with_own = Holder(net, own=True)
    assert user_model(with_own) is with_own
    two = nn.ModuleDict({"encoder": nn.Linear(4, 4), "decoder": nn.Linear(4, 4)})
    assert user_model(two) is two


def test_an_explicit_model_wins() -> None:
    net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    assert user_model(Holder(net), net[0]) is net[0]


def test_step_seen_tells_a_real_step_from_a_skipped_one_and_leaves_no_hook() -> None:
    layer = nn.Linear(2, 1)
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    seen = StepSeen()
    seen.attach([opt])
    layer(torch.ones(1, 2)).sum().backward()
    assert not seen.stepped
    opt.step()
    assert seen.stepped
    seen.reset()
    scaler = torch.amp.GradScaler("cpu", init_scale=1.0)
    scaler.scale(layer(torch.ones(1, 2)).sum()).backward()
    layer.weight.grad.fill_(float("inf"))
    scaler.step(opt)  # inf gradients: the scaler skips opt.step()
    assert not seen.stepped
    seen.remove()
    layer.weight.grad.zero_()
    opt.step()
    assert not seen.stepped


@pytest.mark.parametrize("framework", ["lightning", "fastai", "transformers"])
def test_a_misspelt_option_is_refused_when_the_callback_is_made(framework: str) -> None:
    module = __import__(f"hookscope.integrations.{framework}", fromlist=["HookscopeCallback"])
    with pytest.raises(TypeError, match=r"unknown option.*check_evry.*check_every"):
        module.HookscopeCallback(check_evry=5)


@pytest.mark.parametrize(
    ("framework", "blocked"),
    [("lightning", "lightning"), ("fastai", "fastai"), ("transformers", "transformers")],
)
def test_without_the_framework_the_import_says_how_to_install_it(framework: str, blocked: str) -> None:
    code = f"import sys; sys.modules[{blocked!r}] = None; import hookscope.integrations.{framework}"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert (
        last.startswith("ImportError: hookscope.integrations.")
        and "pip install 'hookscope[integrations]'" in last
    )


class PlainLoopCallback(WatchCallback):
    """A framework reduced to its events, to drive the shared base the way each integration does."""


def _hooks_left(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def test_the_shared_base_counts_real_steps_forgets_skipped_ones_and_closes_an_earlier_watch() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    holder = Holder(net)
    opt = torch.optim.SGD(holder.parameters(), lr=0.1)
    callback = PlainLoopCallback(quiet=True, check_every=2, every=1)
    first = callback._start(holder, None, [opt])
    second = callback._start(holder, None, [opt])  # a fit after one that raised: the old watch goes
    assert first is not second and _hooks_left(net) > 0
    scaler = torch.amp.GradScaler("cpu", init_scale=1.0)
    for step in range(3):
        loss = holder.loss_func(holder.net(torch.rand(8, 4)), torch.randint(0, 2, (8,)))
        callback._log(loss)
        scaler.scale(loss).backward()
        if step == 1:
            net[0].weight.grad.fill_(float("inf"))  # the scaler skips this step
        scaler.unscale_(opt)
        callback._gradients_ready()
        scaler.step(opt)
        scaler.update()
        callback._step_ended()
        opt.zero_grad()
    assert callback.watch is second and second.step == 2
    assert [len(records) for records in second.gradients.values()] == [2] * len(second.gradients)
    callback.close()
    callback.close()
    assert _hooks_left(net) == 0 and callback.findings == second.findings


def fused_adamw(params, lr: float) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=lr, fused=True)


@pytest.mark.parametrize("loop", ["lightning", "fastai", "transformers"])
def test_the_guard_reads_a_step_late_with_a_fused_optimizer_and_stops_where_a_read_before_does(
    loop, tmp_path
) -> None:
    """``guard=True, late=True`` hands the framework's fused optimizer the guard's flag: the NaN gradient of
    the second batch leaves its update out on the device and is named at the next step, with the weights,
    step and blame of a read before the step (``late=False``)."""
    from faults import digits_flat
    from loops import LOOPS

    outcomes = {}
    for late in (False, True):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 32, bias=False), SqrtAbs(), nn.Linear(32, 10))
        train = digits_flat(zero_row=70).train
        folder = {"out": str(tmp_path / str(late))} if loop == "transformers" else {}  # its Trainer's
        findings = LOOPS[loop](
            model, train, 6, 1e-3, fused_adamw, quiet=True, guard=True, late=late, **folder
        )
        (nonfinite,) = [f for f in findings if f.kind == "nonfinite"]
        assert (nonfinite.module, nonfinite.step) == ("1", 1)
        outcomes[late] = {k: v.clone() for k, v in model.state_dict().items()}
    assert all(torch.equal(outcomes[False][k], v) for k, v in outcomes[True].items())


def test_late_true_with_an_optimizer_that_cannot_skip_a_step_is_refused_naming_the_callback() -> None:
    from faults import digits_flat
    from loops import run_lightning

    model = nn.Sequential(nn.Linear(64, 10))
    with pytest.raises(
        ValueError, match=r"^HookscopeCallback\(late=True\): SGD cannot skip a step.*fused=True"
    ):
        run_lightning(model, digits_flat().train, 2, 1e-3, torch.optim.SGD, quiet=True, guard=True, late=True)
    assert not any(p._forward_hooks or p._forward_pre_hooks for p in model.modules())  # no Watch left open
