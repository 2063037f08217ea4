from functools import partial

import pytest
import torch
from faults import LogAct, SqrtAbs
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hookscope as hs
from hookscope.callbacks.guard import NonFiniteGuard


class Snapshots(hs.Callback):
    """Copies the weights after every optimizer step."""

    def __init__(self):
        self.weights = []

    def after_step(self):
        self.weights.append({k: v.detach().clone() for k, v in self.learn.model.state_dict().items()})


def _loaders(x, y, bs=4):
    return hs.DataLoaders(DataLoader(TensorDataset(x, y), batch_size=bs), None)


def _fit(model, x, y, loss=None, n_epoch=1, **guard_kw):
    snaps, guard = Snapshots(), NonFiniteGuard(quiet=True, **guard_kw)
    learn = hs.Learner(model, _loaders(x, y), loss or nn.CrossEntropyLoss(), lr=1e-2, cbs=[guard, snaps])
    learn.fit(n_epoch)
    return learn, guard, snaps


def _positive_data(bad_batch=None):
    torch.manual_seed(0)
    x = torch.rand(32, 4) + 0.5
    if bad_batch is not None:
        x[4 * bad_batch + 1] = -1.0
    return x, torch.randint(0, 3, (32,))


def test_forward_nan_stops_before_the_bad_update_and_names_the_op():
    torch.manual_seed(0)
    model = nn.Sequential(LogAct(), nn.Linear(4, 3))
    x, y = _positive_data(bad_batch=3)
    learn, guard, snaps = _fit(model, x, y)
    assert (guard.stopped_at, guard.reason) == (3, "activation")
    assert len(snaps.weights) == 3  # three good steps, the fourth never landed
    final = learn.model.state_dict()
    assert all(torch.equal(final[k], snaps.weights[-1][k]) for k in final)
    assert all(p.isfinite().all() and p.grad is None for p in learn.model.parameters())
    r = guard.report
    assert (r.phase, r.module, r.module_type, r.op) == ("forward", "0", "LogAct", "aten.log")
    assert "step 3" in guard.message() and "aten.log" in guard.message()


def test_backward_only_nan_is_a_gradient_stop_blamed_on_sqrt_backward():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6, bias=False), SqrtAbs(), nn.Linear(6, 3))
    x, y = _positive_data()
    x[4 * 2] = 0.0  # batch 2 holds a zero row: sqrt(0) has an infinite derivative
    learn, guard, snaps = _fit(model, x, y)
    assert (guard.stopped_at, guard.reason) == (2, "gradient")
    assert len(snaps.weights) == 2
    assert all(p.isfinite().all() for p in learn.model.parameters())
    r = guard.report
    assert (r.phase, r.module, r.op) == ("backward", "1", "SqrtBackward0")


def test_non_finite_loss_is_caught_with_its_reason():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Softmax(dim=1))
    x, y = _positive_data()

    class RatioLoss(nn.Module):
        def forward(self, pred, target):
            return (pred.sum() / self.scale).square()

    loss = RatioLoss()
    scales = iter([1.0, 1.0, 1.0, 0.0] + [1.0] * 10)  # batch 3 divides by zero in the loss only

    class SetScale(hs.Callback):
        def before_batch(self):
            loss.scale = next(scales)

    guard = NonFiniteGuard(quiet=True)
    learn = hs.Learner(model, _loaders(x, y), loss, cbs=[SetScale(), guard])
    learn.fit(1)
    assert (guard.stopped_at, guard.reason) == (3, "loss")
    assert guard.report.module == "loss_fn"


def test_batchnorm_running_stats_of_the_bad_batch_are_rolled_back():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Softplus(), nn.Linear(4, 3))
    x, y = _positive_data()
    x[9, 0] = float("inf")  # batch 2 reaches BatchNorm with an Inf and poisons its running mean
    learn, guard, snaps = _fit(model, x, y)
    assert guard.stopped_at == 2
    assert guard.report.phase == "input"
    bn = learn.model[1]
    assert bn.running_mean.isfinite().all() and bn.running_var.isfinite().all()
    assert torch.equal(bn.running_mean, snaps.weights[-1]["1.running_mean"])
    assert int(bn.num_batches_tracked) == 2  # the bad batch is not counted


def test_healthy_training_is_not_stopped_and_leaves_no_hook():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    x, y = _positive_data()
    learn, guard, snaps = _fit(model, x, y, n_epoch=2)
    assert guard.stopped_at is None and guard.report is None
    assert len(snaps.weights) == 16
    assert sum(len(m._forward_hooks) for m in learn.model.modules()) == 0
    assert "finite" in guard.message()


def test_select_false_still_checks_the_loss():
    torch.manual_seed(0)
    model = nn.Sequential(LogAct(), nn.Linear(4, 3))
    x, y = _positive_data(bad_batch=1)
    _, guard, _ = _fit(model, x, y, select=False)
    assert (guard.stopped_at, guard.reason) == (1, "loss")
    assert guard.report.op == "aten.log"


def test_with_gradient_accumulation_a_nan_in_the_first_batch_of_a_group_is_caught_and_blamed():
    torch.manual_seed(0)
    model = nn.Sequential(LogAct(), nn.Linear(4, 3))
    x, y = _positive_data(bad_batch=2)  # batches 2 and 3 form the second group: step 1
    snaps, guard = Snapshots(), NonFiniteGuard(quiet=True)
    cbs = [hs.callbacks.GradientAccumulation(2), guard, snaps]
    learn = hs.Learner(model, _loaders(x, y), nn.CrossEntropyLoss(), lr=1e-2, cbs=cbs)
    learn.fit(1)
    assert (guard.stopped_at, guard.reason, len(snaps.weights)) == (1, "activation", 1)
    assert all(p.isfinite().all() for p in learn.model.parameters())
    assert (guard.report.module, guard.report.op) == ("0", "aten.log")


def test_a_fault_made_by_another_callback_is_stopped_and_said_to_come_from_the_loop():
    class SpoilGradients(hs.Callback):
        order = 5

        def before_step(self):
            if self.learn.training_step == 2:
                self.learn.model[0].weight.grad[0, 0] = float("nan")

    torch.manual_seed(0)
    x, y = _positive_data()
    guard = NonFiniteGuard(quiet=True)
    learn = hs.Learner(
        nn.Sequential(nn.Linear(4, 3)), _loaders(x, y), nn.CrossEntropyLoss(), cbs=[SpoilGradients(), guard]
    )
    learn.fit(1)
    assert (guard.stopped_at, guard.reason, guard.report.found) == (2, "gradient", False)
    assert "comes from what the loop adds" in guard.message()
    assert learn.model[0].weight.isfinite().all()


def test_a_float16_overflow_is_blamed_by_replaying_under_the_same_autocast():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3))
    with torch.no_grad():
        model[0].weight.fill_(50.0)  # 4 inputs of 400 give 80000: finite in float32, inf in float16
    x, y = _positive_data()
    x[4 * 2 + 1] = 400.0
    guard = NonFiniteGuard(quiet=True)
    mixed = hs.callbacks.MixedPrecision(dtype=torch.float16)
    learn = hs.Learner(model, _loaders(x, y), nn.CrossEntropyLoss(), lr=1e-3, cbs=[mixed, guard])
    learn.fit(1)
    assert (guard.stopped_at, guard.reason) == (2, "activation")
    r = guard.report
    assert r.found and (r.phase, r.module, r.module_type) == ("forward", "0", "Linear")
    assert model(x[9:10]).isfinite().all()  # the same batch in float32 is fine: only autocast overflows


def test_an_activation_inside_a_dataclass_output_is_watched():
    from dataclasses import dataclass

    @dataclass
    class Out:  # the shape of a Hugging Face ModelOutput
        logits: torch.Tensor

    class LogOut(nn.Module):
        def forward(self, h):
            return Out(torch.log(h))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 3)
            nn.init.constant_(self.lin.weight, 0.1)
            nn.init.zeros_(self.lin.bias)
            self.out = LogOut()

        def forward(self, x):
            return self.out(self.lin(x))

    x, y = _positive_data(bad_batch=2)
    _, guard, snaps = _fit(Model(), x, y, loss=lambda out, y: nn.functional.cross_entropy(out.logits, y))
    # the last module's output is the dataclass: only walking into it flags the activation before the loss
    assert (guard.stopped_at, guard.reason) == (2, "activation")
    assert len(snaps.weights) == 2
    assert (guard.report.module, guard.report.op) == ("out", "aten.log")


# ---- read a step late: a fused optimizer leaves the update out on the device --------------------------

FUSED = partial(torch.optim.AdamW, fused=True)


def _fit_fused(model, x, y, late, cbs=(), n_epoch=1, bs=4):
    snaps, guard = Snapshots(), NonFiniteGuard(quiet=True, late=late)
    learn = hs.Learner(
        model, _loaders(x, y, bs), nn.CrossEntropyLoss(), FUSED, lr=1e-2, cbs=[guard, snaps, *cbs]
    )
    learn.fit(n_epoch)
    return learn, guard, snaps


def _same_state(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_read_late_a_forward_nan_keeps_the_weights_and_optimizer_state_of_a_stop_before_the_step():
    x, y = _positive_data(bad_batch=3)
    ends = {}
    for late in (False, True):
        torch.manual_seed(0)
        learn, guard, snaps = _fit_fused(nn.Sequential(LogAct(), nn.Linear(4, 3)), x, y, late)
        assert (guard.stopped_at, guard.reason) == (3, "activation")
        r = guard.report
        assert (r.phase, r.module, r.op) == ("forward", "0", "aten.log")
        assert "step 3 (epoch 0, batch 3)" in guard.message()
        assert all(p.isfinite().all() and p.grad is None for p in learn.model.parameters())
        assert not hasattr(learn.opt, "found_inf")
        ends[late] = (learn.model.state_dict(), learn.opt.state_dict(), snaps.weights)
    (eager, eager_opt, eager_snaps), (late, late_opt, late_snaps) = ends[False], ends[True]
    assert _same_state(eager, late)  # the update of step 3 was left out on the device
    assert len(eager_snaps) == 3 and len(late_snaps) == 4  # step 3 ran, and changed nothing
    assert _same_state(late_snaps[3], late_snaps[2])
    for p_eager, p_late in zip(eager_opt["state"].values(), late_opt["state"].values(), strict=True):
        assert all(torch.equal(p_eager[k], p_late[k]) for k in ("step", "exp_avg", "exp_avg_sq"))
        assert float(p_late["step"]) == 3.0  # the skipped step is not counted


def test_read_late_batchnorm_statistics_go_back_to_the_start_of_the_bad_step():
    x, y = _positive_data()
    x[9, 0] = float("inf")  # batch 2 poisons the running mean; batch 3 runs before the late read
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Softplus(), nn.Linear(4, 3))
    learn, guard, snaps = _fit_fused(model, x, y, late=True)
    assert (guard.stopped_at, guard.report.phase) == (2, "input")
    bn = learn.model[1]
    assert torch.equal(bn.running_mean, snaps.weights[1]["1.running_mean"])
    assert torch.equal(bn.running_var, snaps.weights[1]["1.running_var"])
    assert int(bn.num_batches_tracked) == 2  # batches 2 and 3 are not counted either


def test_read_late_a_backward_only_nan_is_named_a_gradient_fault():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6, bias=False), SqrtAbs(), nn.Linear(6, 3))
    x, y = _positive_data()
    x[4 * 2] = 0.0
    _, guard, _ = _fit_fused(model, x, y, late=True)
    assert (guard.stopped_at, guard.reason, guard.report.phase) == (2, "gradient", "backward")


def test_read_late_a_fault_in_the_epochs_last_step_stops_before_validation_and_its_checkpoint(tmp_path):
    class Validations(hs.Callback):
        run_train = False

        def __init__(self):
            self.count = 0

        def after_validate(self):
            self.count += 1

    torch.manual_seed(0)
    x, y = _positive_data(bad_batch=7)  # the last batch of the epoch: no next step reads its verdict
    validations = Validations()
    snaps, guard = Snapshots(), NonFiniteGuard(quiet=True, late=True)
    ckpt = hs.callbacks.Checkpoint(tmp_path, every_epoch=True)
    dls = hs.DataLoaders(
        DataLoader(TensorDataset(x, y), batch_size=4), DataLoader(TensorDataset(x, y), batch_size=8)
    )
    model = nn.Sequential(LogAct(), nn.Linear(4, 3))
    learn = hs.Learner(
        model, dls, nn.CrossEntropyLoss(), FUSED, lr=1e-2, cbs=[guard, snaps, validations, ckpt]
    )
    learn.fit(2)
    assert (guard.stopped_at, guard.reason) == (7, "activation")
    assert validations.count == 0 and not (tmp_path / "last.pt").exists()
    assert _same_state(learn.model.state_dict(), snaps.weights[6])


def test_read_late_a_checkpoint_due_while_a_bad_step_is_in_flight_is_not_written(tmp_path):
    torch.manual_seed(0)
    x, y = _positive_data(bad_batch=3)  # step 3 ends at training step 4: a save is due then
    ckpt = hs.callbacks.Checkpoint(tmp_path, every_n_steps=2, every_epoch=False)
    _, guard, _ = _fit_fused(nn.Sequential(LogAct(), nn.Linear(4, 3)), x, y, True, cbs=[ckpt])
    assert guard.stopped_at == 3
    saved = torch.load(tmp_path / "last.pt", weights_only=True)
    assert saved["position"]["training_step"] == 2  # the last good checkpoint stays the newest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-00000002.pt", "last.pt"]


def test_read_late_a_healthy_run_trains_exactly_as_a_read_before_each_step():
    x, y = _positive_data()
    ends = []
    for late in (False, True):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
        learn, guard, snaps = _fit_fused(model, x, y, late, n_epoch=2)
        assert guard.stopped_at is None and len(snaps.weights) == 16
        assert not hasattr(learn.opt, "found_inf")
        ends.append(learn.model.state_dict())
    assert _same_state(*ends)


def test_read_late_needs_an_optimizer_that_can_skip_a_step_on_the_device():
    x, y = _positive_data()
    guard = NonFiniteGuard(quiet=True, late=True)
    learn = hs.Learner(nn.Sequential(nn.Linear(4, 3)), _loaders(x, y), nn.CrossEntropyLoss(), cbs=[guard])
    with pytest.raises(ValueError, match=r"late=True\): learn.opt \(AdamW\) cannot skip a step.*fused=True"):
        learn.fit(1)


def test_on_the_cpu_the_doctors_guard_reads_before_the_step_even_with_a_fused_optimizer():
    class Spy(hs.Callback):
        order = 100  # after the guard's before_step

        def __init__(self):
            self.handed = []

        def before_step(self):
            self.handed.append(getattr(self.learn.opt, "found_inf", None))

    x, y = _positive_data()
    spy = Spy()
    cbs = [hs.callbacks.Doctor(quiet=True), spy]
    learn = hs.Learner(nn.Sequential(nn.Linear(4, 3)), _loaders(x, y), nn.CrossEntropyLoss(), FUSED, cbs=cbs)
    learn.fit(1)
    assert spy.handed == [None] * 8  # the read before the step is free here: nothing is handed over


def test_the_default_adamw_is_fused_on_cuda_only():
    x, y = _positive_data()
    learn = hs.Learner(nn.Sequential(nn.Linear(4, 3)), _loaders(x, y), nn.CrossEntropyLoss())
    learn.create_opt()
    assert isinstance(learn.opt, torch.optim.AdamW) and not learn.opt.defaults["fused"]


def test_an_unchecked_group_saved_with_float_buffers_only_still_rolls_back_after_a_resume():
    # a checkpoint written inside gradient accumulation before the 0-d counters were kept
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Softplus(), nn.Linear(4, 3))
    start = [torch.full((4,), 0.25), torch.full((4,), 2.0)]  # running mean and variance of the group's start
    guard = NonFiniteGuard(quiet=True)
    guard.load_state_dict({"activation_ok": [], "loss_ok": [torch.tensor(True)], "buffers": start})
    x, y = _positive_data()
    x[1, 0] = float("inf")  # the first batch after the resume ends the group with a fault
    learn = hs.Learner(model, _loaders(x, y), nn.CrossEntropyLoss(), lr=1e-2, cbs=[guard])
    learn.fit(1)
    assert guard.stopped_at == 0
    assert torch.equal(model[1].running_mean, start[0]) and torch.equal(model[1].running_var, start[1])
