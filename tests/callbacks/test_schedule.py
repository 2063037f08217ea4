import pytest
import torch
from small_learner import StopAtStep, weights
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hookscope as hs
from hookscope.callbacks import (
    CosineAnnealing,
    LRScheduler,
    OneCycle,
    ParamScheduler,
    combine_scheds,
    sched_const,
    sched_cos,
    sched_exp,
    sched_lin,
)

N_BATCHES = 7  # batches per epoch: with 3 epochs, 21 steps, so pct_start * total is not an integer


def _learner(opt_func=torch.optim.AdamW, lr=1e-3, cbs=(), model=None, seed=0):
    torch.manual_seed(0)
    x = torch.randn(8 * N_BATCHES, 4)
    y = x @ torch.randn(4, 1)
    dl = DataLoader(TensorDataset(x, y), batch_size=8)
    torch.manual_seed(seed)
    model = model or nn.Linear(4, 1)
    return hs.Learner(model, (dl, dl), nn.MSELoss(), opt_func=opt_func, lr=lr, cbs=cbs, progress=False)


class HyperProbe(hs.Callback):
    """Records the hyper-parameters the optimizer is about to step with, for every param group."""

    order = 100

    def __init__(self):
        self.lrs, self.moms, self.wds = [], [], []

    def before_step(self):
        groups = self.learn.opt.param_groups
        self.lrs.append([g["lr"] for g in groups])
        self.moms.append([g["betas"][0] if "betas" in g else g["momentum"] for g in groups])
        self.wds.append([g["weight_decay"] for g in groups])


def _flat(rows):
    return [value for row in rows for value in row]


def _torch_reference(scheduler_factory, opt_cls, n_steps, n_groups=1, **opt_kwargs):
    """The lrs and momenta a plain torch loop steps with under ``scheduler_factory(opt)``."""
    params = [[nn.Parameter(torch.zeros(1))] for _ in range(n_groups)]
    opt = opt_cls([{"params": p} for p in params], lr=1e-3, **opt_kwargs)
    sched = scheduler_factory(opt)
    lrs, moms = [], []
    for _ in range(n_steps):
        lrs.append([g["lr"] for g in opt.param_groups])
        moms.append([g["betas"][0] if "betas" in g else g["momentum"] for g in opt.param_groups])
        opt.step()
        sched.step()
    return lrs, moms


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"pct_start": 0.25, "anneal_strategy": "linear", "div_factor": 10.0, "final_div_factor": 100.0},
        {"three_phase": True, "base_momentum": 0.8, "max_momentum": 0.9},
    ],
)
def test_one_cycle_lrs_and_betas_equal_torch_one_cycle_lr(kwargs):
    probe = HyperProbe()
    learn = _learner(cbs=[probe])
    learn.fit(3, cbs=[OneCycle(0.01, **kwargs)])

    n_steps = 3 * N_BATCHES
    ref_lrs, ref_moms = _torch_reference(
        lambda opt: torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.01, total_steps=n_steps, **kwargs),
        torch.optim.AdamW,
        n_steps,
    )
    assert len(probe.lrs) == n_steps
    assert _flat(probe.lrs) == pytest.approx(_flat(ref_lrs), rel=1e-9, abs=1e-15)
    assert _flat(probe.moms) == pytest.approx(_flat(ref_moms), rel=1e-9)
    assert learn.recorder.lrs == pytest.approx([lrs[0] for lrs in ref_lrs], rel=1e-9, abs=1e-15)


def test_one_cycle_cycles_sgd_momentum_per_param_group():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))

    def two_groups(params, lr):
        first, second = model[0].parameters(), model[1].parameters()
        return torch.optim.SGD([{"params": first}, {"params": second}], lr=lr, momentum=0.9)

    probe = HyperProbe()
    learn = _learner(opt_func=two_groups, model=model, cbs=[probe])
    learn.fit(2, cbs=[OneCycle([0.1, 0.02])])

    n_steps = 2 * N_BATCHES
    ref_lrs, ref_moms = _torch_reference(
        lambda opt: torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=[0.1, 0.02], total_steps=n_steps),
        torch.optim.SGD,
        n_steps,
        n_groups=2,
        momentum=0.9,
    )
    assert _flat(probe.lrs) == pytest.approx(_flat(ref_lrs), rel=1e-9, abs=1e-15)
    assert _flat(probe.moms) == pytest.approx(_flat(ref_moms), rel=1e-9)


def test_fit_one_cycle_defaults_lr_max_to_learner_lr():
    probe = HyperProbe()
    learn = _learner(lr=0.05, cbs=[probe])
    learn.fit_one_cycle(1)

    peak = max(lrs[0] for lrs in probe.lrs)
    assert peak == pytest.approx(0.05, rel=0.05)
    assert probe.lrs[0][0] == pytest.approx(0.05 / 25)
    assert not any(isinstance(cb, OneCycle) for cb in learn.cbs)


def test_cosine_annealing_equals_torch_cosine_annealing_lr():
    probe = HyperProbe()
    learn = _learner(cbs=[probe])
    learn.fit(2, cbs=[CosineAnnealing(0.1, lr_min=1e-3)])

    n_steps = 2 * N_BATCHES
    ref_lrs, _ = _torch_reference(
        lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=n_steps, eta_min=1e-3),
        lambda params, lr: torch.optim.SGD(params, lr=0.1, momentum=0.0),
        n_steps,
    )
    assert _flat(probe.lrs) == pytest.approx(_flat(ref_lrs), rel=1e-9)


def test_param_scheduler_sets_any_hyper_parameter_before_each_step():
    probe = HyperProbe()
    learn = _learner(cbs=[probe])
    learn.fit(1, cbs=[ParamScheduler({"weight_decay": sched_lin(0.0, 0.7), "lr": sched_const(0.02)})])

    expected = [0.7 * i / N_BATCHES for i in range(N_BATCHES)]
    assert [w[0] for w in probe.wds] == pytest.approx(expected)
    assert {lrs[0] for lrs in probe.lrs} == {0.02}


def test_param_scheduler_names_the_missing_hyper_parameter():
    learn = _learner(opt_func=torch.optim.SGD)
    with pytest.raises(ValueError, match=r"SGD param groups have no 'betas2'.*lr"):
        learn.fit(1, cbs=[ParamScheduler({"betas2": sched_const(0.9)})])


def test_one_cycle_on_an_optimizer_without_momentum_says_how_to_proceed():
    learn = _learner(opt_func=torch.optim.Adagrad)
    with pytest.raises(ValueError, match=r"Adagrad param groups have no 'momentum' \(for OneCycle: cycle_m"):
        learn.fit_one_cycle(1)
    learn.fit_one_cycle(1, cycle_momentum=False)
    assert learn.opt.param_groups[0]["lr"] == pytest.approx(1e-3 / 25 / 1e4)


def test_param_scheduler_rejects_one_schedule_list_per_wrong_group_count():
    learn = _learner()
    with pytest.raises(ValueError, match="2 schedules for 'lr' but the optimizer has 1 param groups"):
        learn.fit(1, cbs=[ParamScheduler({"lr": [sched_const(0.1), sched_const(0.2)]})])


def test_schedule_functions_hit_their_end_points():
    assert sched_lin(1.0, 3.0)(0.5) == pytest.approx(2.0)
    assert sched_cos(1.0, 0.0)(0.0) == pytest.approx(1.0)
    assert sched_cos(1.0, 0.0)(0.5) == pytest.approx(0.5)
    assert sched_cos(1.0, 0.0)(1.0) == pytest.approx(0.0)
    assert sched_exp(1e-4, 1.0)(0.5) == pytest.approx(1e-2)


def test_combine_scheds_runs_each_schedule_over_its_share():
    warmup_then_decay = combine_scheds([0.25, 0.75], [sched_lin(0.0, 1.0), sched_cos(1.0, 0.0)])
    assert warmup_then_decay(0.0) == pytest.approx(0.0)
    assert warmup_then_decay(0.125) == pytest.approx(0.5)
    assert warmup_then_decay(0.25) == pytest.approx(1.0)
    assert warmup_then_decay(0.625) == pytest.approx(0.5)
    assert warmup_then_decay(1.0) == pytest.approx(0.0)
    with pytest.raises(ValueError, match="summing to 1"):
        combine_scheds([0.5, 0.6], [sched_const(1), sched_const(2)])


def test_lr_scheduler_steps_per_step_like_a_torch_loop():
    probe = HyperProbe()
    learn = _learner(cbs=[probe])
    n_steps = 2 * N_BATCHES

    def factory(opt):
        return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.01, total_steps=n_steps)

    learn.fit(2, cbs=[LRScheduler(factory)])
    ref_lrs, ref_moms = _torch_reference(factory, torch.optim.AdamW, n_steps)
    assert _flat(probe.lrs) == pytest.approx(_flat(ref_lrs), rel=1e-9)
    assert _flat(probe.moms) == pytest.approx(_flat(ref_moms), rel=1e-9)


def test_lr_scheduler_steps_per_epoch():
    probe = HyperProbe()
    learn = _learner(lr=0.1, cbs=[probe])
    sched = LRScheduler(lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5), "epoch")
    learn.fit(3, cbs=[sched])

    per_epoch = [probe.lrs[e * N_BATCHES][0] for e in range(3)]
    assert per_epoch == pytest.approx([0.1, 0.05, 0.025])
    assert len({lrs[0] for lrs in probe.lrs[:N_BATCHES]}) == 1


def test_lr_scheduler_feeds_reduce_on_plateau_the_monitored_value():
    # mode="max" on a falling valid_loss: every epoch after the first is "no improvement".
    learn = _learner(opt_func=torch.optim.SGD, lr=0.5)
    factory = lambda opt: torch.optim.lr_scheduler.ReduceLROnPlateau(opt, "max", factor=0.1, patience=0)  # noqa: E731
    learn.fit(3, cbs=[LRScheduler(factory, "epoch", monitor="valid_loss")])
    losses = [row["valid_loss"] for row in learn.recorder.history]
    assert losses[0] > losses[1] > losses[2]
    assert learn.opt.param_groups[0]["lr"] == pytest.approx(0.5 * 0.1**2)


def test_lr_scheduler_names_a_missing_monitor():
    learn = _learner()
    factory = lambda opt: torch.optim.lr_scheduler.ReduceLROnPlateau(opt)  # noqa: E731
    with pytest.raises(KeyError, match=r"no 'accuracy' in learn\.recorder\.history"):
        learn.fit(1, cbs=[LRScheduler(factory, "epoch", monitor="accuracy")])


def test_reduce_on_plateau_without_validation_data_must_monitor_the_train_loss():
    x = torch.randn(16, 4)
    dl = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
    learn = hs.Learner(nn.Linear(4, 1), (dl, None), nn.MSELoss(), progress=False)
    factory = lambda opt: torch.optim.lr_scheduler.ReduceLROnPlateau(opt)  # noqa: E731
    with pytest.raises(ValueError, match="monitors 'valid_loss', measured on validation data"):
        learn.fit(1, cbs=[LRScheduler(factory, "epoch")])
    learn.fit(1, cbs=[LRScheduler(factory, "epoch", monitor="train_loss")])


def test_lr_scheduler_state_dict_resumes_the_torch_scheduler():
    learn = _learner()
    factory = lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)  # noqa: E731
    first = LRScheduler(factory)
    learn.fit(1, cbs=[first])
    state = first.state_dict()
    assert state["scheduler"]["last_epoch"] == N_BATCHES

    resumed = LRScheduler(factory)
    resumed.load_state_dict(state)
    learn.fit(1, cbs=[resumed])
    assert resumed.scheduler.last_epoch == 2 * N_BATCHES


def test_lr_scheduler_refuses_a_scheduler_built_on_another_optimizer():
    learn = _learner()
    other = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
    cb = LRScheduler(torch.optim.lr_scheduler.StepLR(other, step_size=1))
    with pytest.raises(ValueError, match=r"another optimizer than learn\.opt"):
        learn.fit(1, cbs=[cb])


def test_one_cycle_rejects_bad_arguments():
    with pytest.raises(ValueError, match="pct_start"):
        OneCycle(0.1, pct_start=1.5)
    with pytest.raises(ValueError, match="anneal_strategy"):
        OneCycle(0.1, anneal_strategy="exp")


def test_one_cycle_with_fp16_and_clipping_resumes_mid_epoch_exactly(tmp_path):
    def cbs():
        return [hs.callbacks.MixedPrecision(torch.float16), hs.callbacks.GradientClip(0.5)]

    reference = _learner(cbs=cbs())
    reference.fit_one_cycle(2, 0.05)

    first = _learner(cbs=[*cbs(), hs.callbacks.Checkpoint(tmp_path, every_n_steps=1)])
    first.fit_one_cycle(2, 0.05, cbs=[StopAtStep(N_BATCHES + 3)])
    assert first.training_step == N_BATCHES + 3

    # Another initialisation: only a real resume can end at the reference's weights.
    resumed = _learner(cbs=[*cbs(), hs.callbacks.Checkpoint(tmp_path, every_n_steps=1)], seed=7)
    resumed.fit_one_cycle(2, 0.05, resume="last")
    assert resumed.recorder.lrs == pytest.approx(reference.recorder.lrs, rel=1e-12)
    assert all(torch.equal(a, b) for a, b in zip(weights(reference), weights(resumed), strict=True))


def test_lr_scheduler_resumes_its_torch_scheduler_exactly(tmp_path):
    def factory(opt):
        return torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)

    reference = _learner(opt_func=torch.optim.SGD, lr=0.05)
    reference.fit(2, cbs=[LRScheduler(factory)])

    first = _learner(
        opt_func=torch.optim.SGD, lr=0.05, cbs=[hs.callbacks.Checkpoint(tmp_path, every_n_steps=1)]
    )
    first.fit(2, cbs=[LRScheduler(factory), StopAtStep(5)])

    resumed = _learner(
        opt_func=torch.optim.SGD, lr=0.05, cbs=[hs.callbacks.Checkpoint(tmp_path, every_n_steps=1)]
    )
    cb = LRScheduler(factory)
    resumed.fit(2, cbs=[cb], resume="last")
    assert cb.scheduler.last_epoch == 2 * N_BATCHES
    assert resumed.recorder.lrs == pytest.approx(reference.recorder.lrs, rel=1e-12)
    assert all(torch.equal(a, b) for a, b in zip(weights(reference), weights(resumed), strict=True))
