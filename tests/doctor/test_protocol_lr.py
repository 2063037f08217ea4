"""lr_schedule: a per-epoch scheduler stepped per batch collapses the learning rate early; a factor above
1 grows it without bound. Warm-up then cosine, one-cycle and StepLR stepped per epoch are silent."""

import math

import torch
from faults import digits_flat, mlp
from protocol_loops import Feed
from torch import nn

import hookscope as hs

BATCHES = 10  # per epoch


def _run(make_scheduler, epochs=40, per_batch=True, known_length=True, named=True):
    """A linear model on random data for ``epochs`` x BATCHES steps; the scheduler steps per batch or per
    epoch. Returns the lr_schedule findings."""
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = make_scheduler(opt)
    total = epochs * BATCHES
    options = {"total_steps": total if known_length else None, "schedulers": [scheduler] if named else ()}
    feed = Feed(model, opt, check_every=10, **options)
    x, y = torch.randn(BATCHES, 16, 8), torch.randn(BATCHES, 16, 1)
    for _ in range(epochs):
        for i in range(BATCHES):
            opt.zero_grad()
            nn.functional.mse_loss(model(x[i]), y[i]).backward()
            opt.step()
            if per_batch:
                scheduler.step()
        if not per_batch:
            scheduler.step()
    return [f for f in feed.close() if f.kind == "lr_schedule"]


def _step_lr(opt):
    return torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.1)  # 5 epochs, meant per epoch


def test_per_epoch_step_lr_stepped_per_batch_is_named():
    [finding] = _run(_step_lr)
    assert finding.step == 20  # the first step below 1/1000 of the peak: 0.1 -> 1e-5
    assert finding.severity == "error"
    assert finding.evidence["scheduler"] == "StepLR"
    assert "once per epoch" in finding.message and "StepLR" in finding.message


def test_without_the_run_length_the_collapse_waits_for_ten_times_its_step():
    feed_steps = []

    def exponential(opt):
        return torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)  # 1e-3 of peak after 66 steps

    [finding] = _run(exponential, epochs=80, known_length=False, named=False)
    feed_steps.append(finding.step)
    assert finding.step == math.ceil(math.log(1e-3) / math.log(0.9))
    assert finding.evidence["scheduler"] == "a scheduler"
    assert _run(exponential, epochs=60, known_length=False) == []  # 600 steps: not yet 10x step 66


def test_a_learning_rate_that_grows_without_bound_is_named_at_the_end():
    [finding] = _run(lambda opt: torch.optim.lr_scheduler.ExponentialLR(opt, gamma=1.01))
    assert finding.severity == "warning"
    assert finding.evidence["last"] > 10 * finding.evidence["first"]
    assert "grow without bound" in finding.message


def _warmup_cosine(opt):
    warmup = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1e-3, total_iters=40)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=360)
    return torch.optim.lr_scheduler.SequentialLR(opt, [warmup, cosine], milestones=[40])


def test_healthy_schedules_are_silent():
    assert _run(_warmup_cosine) == []
    assert _run(_warmup_cosine, known_length=False) == []
    one_cycle = lambda opt: torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=400)  # noqa: E731
    assert _run(one_cycle) == []
    assert _run(one_cycle, known_length=False) == []
    assert _run(_step_lr, per_batch=False) == []
    assert _run(lambda opt: torch.optim.lr_scheduler.ConstantLR(opt, factor=0.5, total_iters=50)) == []


def test_a_second_fit_judges_its_warm_up_at_its_own_close_not_as_if_the_run_had_ended():
    torch.manual_seed(0)
    doctor = hs.callbacks.Doctor(quiet=True)
    learn = hs.Learner(
        mlp(depth=3), digits_flat(), nn.CrossEntropyLoss(), torch.optim.SGD, 1e-3, cbs=[doctor]
    )
    learn.fit(1)  # 23 steps at a constant lr, then the close that judges growth
    # one-cycle over 92 steps: the lr climbs from 4e-3 to 0.1 (100x the first fit's) until step 23+23,
    # then anneals; the checks at steps 30 and 40 saw it rising at its highest, and took it for the end
    learn.fit_one_cycle(4, lr_max=0.1)
    assert [f for f in doctor.findings if f.kind == "lr_schedule"] == []
    assert learn.training_step == 23 + 92
