"""The runtime rules added to the catalogue (plateau, oscillating_loss, not_updated, overfitting) on
hand-made histories, and the adaptive schedule that keeps the Doctor cheap, on a real engine."""

import math

import torch
from torch import nn

from hookscope.doctor import rules
from hookscope.doctor.engine import Engine
from hookscope.doctor.findings import Thresholds
from hookscope.doctor.record_types import ParamRecord

TH = Thresholds()


def _steps(values):
    return list(enumerate(values))


def _bouncing(n, level, swing):
    """``n`` losses bouncing by ``swing`` around ``level`` once training started: the first three at the
    level (a loss that bounces from its very first value is a fitted model's batch noise, not a bounce
    that training caused: ``rules.fits_at_start``)."""
    return [level if i < 3 else level * (1 + swing if i % 2 else 1 - swing) for i in range(n)]


def test_a_falling_loss_and_a_converged_noisy_one_are_not_stalled():
    falling = [2.3 * math.exp(-i / 30) for i in range(100)]
    converged = [2.3 * math.exp(-i / 5) for i in range(50)] + _bouncing(50, 0.02, 0.8)
    assert rules.stalled_loss(_steps(falling), TH) == []
    assert rules.stalled_loss(_steps(converged), TH) == []  # bounces, but far below half its start


def test_a_flat_loss_never_started_and_a_stalled_one_say_where_they_stand():
    (never,) = rules.stalled_loss(_steps([2.3] * 50), TH)
    assert (never.kind, never.step) == ("plateau", 0) and "never started to fall" in never.message
    stalled = [2.3 - 0.9 * i / 25 for i in range(25)] + [1.4] * 50
    (finding,) = rules.stalled_loss(_steps(stalled), TH)
    assert finding.kind == "plateau" and finding.step == 25
    assert "stopped falling at 62% of its start" in finding.message


def test_a_bouncing_loss_far_from_its_best_is_oscillating_not_a_plateau():
    (finding,) = rules.stalled_loss(_steps(_bouncing(60, 2.0, 0.5)), TH)
    assert finding.kind == "oscillating_loss" and finding.evidence["spread"] > 0.5
    assert rules.stalled_loss(_steps(_bouncing(49, 2.0, 0.5)), TH) == []  # two windows needed


def test_the_stall_windows_grow_with_the_run():
    slow = [2.3 * math.exp(-i / 400) for i in range(800)]  # late progress is slow, but progress
    assert rules.stalled_loss(_steps(slow), TH) == []
    (finding,) = rules.stalled_loss(_steps([2.3] * 400), TH)
    assert finding.evidence["window"] == 50 and finding.step == 300


def test_the_stall_rule_judges_the_losses_it_reads_and_is_silent_when_one_of_them_is_not_finite():
    flat = [2.3] * 400  # windows of 50: the start is losses 0-2, the windows losses 300-399
    skipped = [*flat[:100], math.inf, *flat[101:]]  # one step a grad scaler skipped, long ago
    assert [f.kind for f in rules.stalled_loss(_steps(skipped), TH)] == ["plateau"]
    for i in (1, 350):  # in the start or in a window: no median to trust
        assert rules.stalled_loss(_steps([*flat[:i], math.nan, *flat[i + 1 :]]), TH) == []


def _records(ratio, n=3, grad=1.0):
    return [ParamRecord(step, grad, ratio) for step in range(n)]


def test_not_updated_names_the_cause_it_can_see():
    params = {"fc.weight": _records(0.0), "fc.bias": _records(0.0), "head.weight": _records(1e-3)}
    (unknown,) = rules.not_updated(params, None, TH)
    assert (unknown.module, unknown.evidence["parameters"]) == ("fc", ["fc.weight", "fc.bias"])
    assert "leaves them unchanged" in unknown.message
    (missing,) = rules.not_updated(params, {"head.weight": (0, 1e-3)}, TH)
    assert "not in the optimizer" in missing.message
    groups = {"fc.weight": (1, 0.0), "fc.bias": (1, 0.0), "head.weight": (0, 1e-3)}
    (zero,) = rules.not_updated(params, groups, TH)
    assert "param group 1 has learning rate 0" in zero.message


def test_not_updated_needs_gradients_and_measured_steps():
    assert rules.not_updated({"a.weight": _records(0.0, grad=0.0)}, None, TH) == []  # no gradient
    assert rules.not_updated({"a.weight": _records(None)}, None, TH) == []  # steps not measured
    assert rules.not_updated({"a.weight": _records(0.0, n=2)}, None, TH) == []  # under patience
    moved_once = [*_records(0.0), ParamRecord(3, 1.0, 1e-4)]
    assert rules.not_updated({"a.weight": moved_once}, None, TH) == []


def test_overfitting_needs_a_rising_validation_loss_and_a_falling_training_loss():
    train = [2.0, 1.5, 1.0, 0.6, 0.3, 0.1]
    valid = [2.0, 1.6, 1.4, 1.5, 1.7, 1.9]
    rows = [(e, 10 * (e + 1), t, v) for e, (t, v) in enumerate(zip(train, valid, strict=True))]
    (finding,) = rules.overfitting(rows, TH)
    assert (finding.step, finding.evidence["best_epoch"]) == (30, 2)
    assert "since epoch 3 (step 30)" in finding.message
    assert rules.overfitting(rows[:5], TH) == []  # only two epochs past the best
    worse = [(e, s, t + e, v) for e, s, t, v in rows]  # the training loss rose too: not overfitting
    assert rules.overfitting(worse, TH) == []
    assert rules.overfitting([(e, s, t, math.nan) for e, s, t, _ in rows], TH) == []


def _train(engine, model, opt, steps, fault_at=None):
    """A hand-written loop feeding ``engine`` one batch on purpose (it is told: no repeated_batch):
    ``fault_at`` kills every unit of the ReLU at that step."""
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 8, generator=gen), torch.randint(0, 4, (32,), generator=gen)
    engine.plan_run(batches_per_epoch=1)
    for step in range(steps):
        if step == fault_at:
            with torch.no_grad():
                model[0].bias.fill_(-100.0)
        engine.begin_batch(step, training=True)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        engine.log_loss(loss, training=True)
        loss.backward()
        engine.gradients_ready()
        opt.step()
        engine.step_done()
        engine.end_batch()
    engine.close()


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def test_a_zero_learning_rate_group_is_named_by_the_engine():
    model = _mlp()
    opt = torch.optim.SGD(
        [{"params": model[0].parameters(), "lr": 0.0}, {"params": model[2].parameters()}], 0.1
    )
    engine = Engine(quiet=True, check_every=5)
    engine.attach(model)
    engine.watch_optimizer(opt)
    _train(engine, model, opt, 10)
    (finding,) = [f for f in engine.findings if f.kind == "not_updated"]
    assert finding.module == "0" and "param group 0 has learning rate 0" in finding.message


def test_the_adaptive_schedule_is_sparse_when_healthy_and_dense_once_suspicious():
    model = _mlp()
    engine = Engine(every=None, quiet=True)
    engine.attach(model)
    _train(engine, model, torch.optim.SGD(model.parameters(), 0.05), 160)
    assert [r.step for r in engine.gradients.param_history["0.weight"]] == [*range(5), 50, 100, 150]
    assert engine.findings == []

    model = _mlp()
    engine = Engine(every=None, quiet=True)
    engine.attach(model)
    _train(engine, model, torch.optim.SGD(model.parameters(), 0.05), 80, fault_at=30)
    # the sparse record of step 50 shows dead units; the check after step 64 turns dense recording on
    assert [r.step for r in engine.gradients.param_history["0.weight"]] == [*range(5), 50, *range(65, 80)]
    (dead,) = [f for f in engine.findings if f.kind == "dead_units"]
    assert (dead.module, dead.step) == ("1", 50)
