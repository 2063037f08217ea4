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
