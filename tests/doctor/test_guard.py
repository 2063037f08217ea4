"""doctor/guard.py: the guard's decision at a step, and the journal and replay that name the culprit."""

import math

import pytest
import torch
from faults import LogAct
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hookscope as hs
from hookscope.callbacks.guard import NonFiniteGuard
from hookscope.doctor.guard import BatchJournal, NonFiniteCheck, stop_message
from hookscope.doctor.selection import module_in_training
from hookscope.hooks.nonfinite import NonFiniteReport
from hookscope.watching import NonFiniteError

CPU = torch.device("cpu")


def test_the_guard_decision_names_the_first_failed_check_and_clears_when_all_is_finite():
    model = nn.Sequential(nn.Linear(2, 2))
    check = NonFiniteCheck(None, training=module_in_training)
    check.attach(model)
    loss = model(torch.ones(1, 2)).sum()
    loss.backward()
    kept = loss.item()
    check.loss(loss)
    assert check.decide(model.parameters(), torch.device("cpu")) is None
    assert check.extremes == [] and check.losses == [] and loss.item() == kept  # the loop's loss as it was
    check.loss(torch.tensor(math.nan))
    assert check.decide(model.parameters(), torch.device("cpu")) == "loss"
    model(torch.full((1, 2), math.inf))
    assert check.decide(model.parameters(), torch.device("cpu")) == "activation"
    check.clear()  # a loop that goes on after a stop: the next steps are judged on their own
    check.loss(torch.tensor(1.0))
    assert check.decide(model.parameters(), torch.device("cpu")) is None
    check.detach()
    assert len(model[0]._forward_hooks) == 0


def test_the_guard_takes_large_finite_losses_and_outputs_as_finite_and_keeps_an_unchecked_group():
    model = nn.Sequential(nn.Linear(2, 2))
    check = NonFiniteCheck(None, training=module_in_training)
    check.attach(model)
    check.loss(torch.full((4,), 3e38))  # finite float32 values whose float32 sum would be inf
    assert check.decide(model.parameters(), torch.device("cpu")) is None
    with torch.no_grad():
        model[0].weight.fill_(1.0)
    for _ in range(2):  # outputs of 2e20 (two forwards of a step): finite, but not a 2-norm's squares
        model(torch.full((1, 2), 1e20))
    assert len(check.extremes) == 4 and all(math.isfinite(e) and abs(e) > 1e20 for e in check.extremes)
    assert check.decide(model.parameters(), torch.device("cpu")) is None
    check.loss(torch.tensor([1.0, math.nan]))
    assert check.decide(model.parameters(), torch.device("cpu")) == "loss"
    check.clear()
    model(torch.full((1, 2), math.inf))  # a checkpoint taken inside a group that saw an inf output
    restored = NonFiniteCheck(None, training=module_in_training)
    restored.load_state_dict(check.state_dict(), torch.device("cpu"))
    assert restored.decide(model.parameters(), torch.device("cpu")) == "activation"
    check.detach()


@pytest.mark.filterwarnings("ignore:Sparse invariant checks")  # torch's note on building a sparse tensor
def test_the_guard_checks_every_gradient_in_any_dtype_and_layout_and_leaves_the_values_as_they_were():
    grads = [
        torch.tensor([-0.0, 1e-45, 3e38]),  # a negative zero, a float32 denormal, a large finite value
        torch.tensor([1.5, -2.0], dtype=torch.float64),
        torch.randn(2, 2, 3, 3).to(memory_format=torch.channels_last),
        torch.tensor([0.5, 70000.0], dtype=torch.bfloat16),
        torch.randn(4, 3)[::2],  # a view that is not contiguous
    ]
    params = [nn.Parameter(torch.zeros(g.shape, dtype=g.dtype)) for g in grads]
    for p, g in zip(params, grads, strict=True):
        p.grad = g  # as they are: the strides too
    assert not params[2].grad.is_contiguous() and not params[4].grad.is_contiguous()
    before = [g.clone() for g in grads]
    check = NonFiniteCheck(False, training=module_in_training)
    check.loss(torch.tensor(2.0))
    assert check.decide(params, CPU) is None
    for p, g in zip(params, before, strict=True):  # bit for bit: the sign of zero, the denormal
        assert torch.equal(p.grad.reshape(-1).view(torch.uint8), g.reshape(-1).view(torch.uint8))
    for p in params:
        first = (0,) * p.grad.dim()
        kept = p.grad[first].item()
        for bad in (math.nan, math.inf, -math.inf):
            p.grad[first] = bad
            check.loss(torch.tensor(2.0))
            assert check.decide(params, CPU) == "gradient", (p.grad.dtype, bad)
        p.grad[first] = kept
    sparse = nn.Parameter(torch.zeros(5, 3))  # an nn.Embedding(sparse=True)'s gradient: not strided
    sparse.grad = torch.sparse_coo_tensor([[1, 3]], torch.ones(2, 3), (5, 3))
    check.loss(torch.tensor(2.0))
    assert check.decide([*params, sparse], CPU) is None
    sparse.grad = torch.sparse_coo_tensor([[1, 3]], torch.tensor([[1.0, math.nan, 0.0], [0.0] * 3]), (5, 3))
    check.loss(torch.tensor(2.0))
    assert check.decide([*params, sparse], CPU) == "gradient"
    check.loss(torch.tensor(math.inf))
    assert check.decide(params, CPU) == "loss"


class Draws(nn.Module):
    """Adds fresh noise to its input and keeps it, with the autocast dtype it ran under."""

    def __init__(self):
        super().__init__()
        self.noise: list[torch.Tensor] = []
        self.autocast: list[torch.dtype | None] = []

    def forward(self, x):
        noise = torch.rand(x.shape)
        self.noise.append(noise)
        self.autocast.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None)
        return x + noise


def test_the_replay_draws_what_the_batch_drew_and_runs_under_its_autocast():
    model = nn.Sequential(Draws(), LogAct())
    x = torch.full((2, 3), -5.0)  # x + noise < 0: log makes NaN
    journal = BatchJournal(CPU)
    torch.manual_seed(0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        journal.record((x,))
        model(x)
    torch.rand(100)  # the loop draws on before the step is checked
    report = journal.blame(model, loss_func=None)
    assert (report.found, report.phase, report.module, report.op) == (True, "forward", "1", "aten.log")
    drawn = model[0].noise
    assert len(drawn) >= 2 and all(torch.equal(n, drawn[0]) for n in drawn[1:])
    assert model[0].autocast == [torch.bfloat16] * len(drawn)


def test_the_batches_of_a_group_are_replayed_in_order_until_one_is_found_and_cleared_after_a_step():
    model = nn.Sequential(nn.Linear(3, 3), LogAct())
    with torch.no_grad():
        model[0].weight.copy_(torch.eye(3))
        model[0].bias.zero_()
    journal = BatchJournal(CPU)
    journal.record((torch.ones(2, 3),), targets=(torch.zeros(2, 3),))
    journal.record((-torch.ones(2, 3),), targets=(torch.zeros(2, 3),))
    report = journal.blame(model, nn.MSELoss())
    assert (report.module, report.op, report.input_shapes) == ("1", "aten.log", [(2, 3)])
    journal.clear()
    assert journal.blame(model, nn.MSELoss()) == NonFiniteReport(found=False)


def test_a_forward_with_positional_and_keyword_inputs_is_passed_over():
    journal = BatchJournal(CPU)
    journal.record((-torch.ones(1, 2),), {"scale": 2.0})
    assert not journal.blame(LogAct(), loss_func=None).found


def test_the_stop_message_says_who_stopped_where_what_is_kept_and_the_blame():
    found = NonFiniteReport(True, "forward", "1", "LogAct", "aten.log", 0, [(2, 3)], [(2, 3)], 6, 0)
    message = stop_message("hs.watch stopped optimizer step 4", 4, "activation", found, with_loss=False)
    assert message.startswith(
        "hs.watch stopped optimizer step 4: the first non-finite value was in the activation."
    )
    assert "keeps the weights of step 4" in message and message.endswith(str(found))
    clean = NonFiniteReport(found=False)
    with_loss = stop_message("NonFiniteGuard stopped training at step 2", 2, "loss", clean, with_loss=True)
    assert "forward, loss and backward" in with_loss and "a callback that changes the loss" in with_loss
    stand_in = stop_message("hs.watch stopped optimizer step 2", 2, "loss", clean, with_loss=False)
    assert "the sum of the outputs" in stand_in and "the loss function or the targets" in stand_in


def _faulty_model_and_data():
    """A log layer and positive data but for one row of the fourth batch of 4: NaN at step 3."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), LogAct(), nn.Linear(4, 3))
    with torch.no_grad():
        model[0].weight.copy_(torch.eye(4))
        model[0].bias.zero_()
    x = torch.rand(16, 4) + 0.5
    x[13] = -1.0
    return model, x, torch.randint(0, 3, (16,))


def test_the_learners_guard_and_hs_watch_blame_the_same_module_and_op_on_the_same_batch():
    model, x, y = _faulty_model_and_data()
    guard = NonFiniteGuard(quiet=True)
    dls = hs.DataLoaders(DataLoader(TensorDataset(x, y), batch_size=4), None)
    hs.Learner(model, dls, nn.CrossEntropyLoss(), lr=0.0, cbs=[guard]).fit(1)

    model, x, y = _faulty_model_and_data()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with pytest.raises(NonFiniteError) as stop, hs.watch(model, opt, guard=True, stats=False, doctor=False):
        for xb, yb in zip(x.split(4), y.split(4), strict=True):
            opt.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
    watched = stop.value.report
    assert (guard.stopped_at, stop.value.step) == (3, 3)
    assert (guard.reason, stop.value.reason) == ("activation", "activation")
    blamed = (watched.phase, watched.module, watched.module_type, watched.op, watched.input_shapes)
    assert blamed == ("forward", "1", "LogAct", "aten.log", [(4, 4)])
    assert (guard.report.phase, guard.report.module, guard.report.module_type, guard.report.op,
            guard.report.input_shapes) == blamed  # fmt: skip
    assert (guard.report.nan, watched.nan) == (4, 4)
    assert str(guard.report) in guard.message() and str(watched) in str(stop.value)
