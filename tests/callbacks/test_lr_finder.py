import copy
import math

import numpy as np
import pytest
import torch
from matplotlib.figure import Figure
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hookscope as hs
from hookscope.callbacks import (
    EarlyStopping,
    GradientAccumulation,
    LRFinder,
    LRFindResult,
    MixedPrecision,
    OneCycle,
)
from hookscope.callbacks.lr_finder import suggest_lrs, sweeping
from hookscope.run_reader import read_metrics


def _learner(opt_func=torch.optim.AdamW, cbs=()):
    torch.manual_seed(0)
    x = torch.randn(128, 8)
    y = x @ torch.randn(8, 1) + 0.1 * torch.randn(128, 1)
    train = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    valid = DataLoader(TensorDataset(x, y), batch_size=64)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 1))
    return hs.Learner(
        model, (train, valid), nn.MSELoss(), opt_func=opt_func, lr=1e-3, cbs=cbs, progress=False
    )


def _assert_same_state(got, expected):
    if isinstance(expected, torch.Tensor):
        assert torch.equal(got, expected)
    elif isinstance(expected, dict):
        assert got.keys() == expected.keys()
        for key in expected:
            _assert_same_state(got[key], expected[key])
    elif isinstance(expected, list | tuple):
        assert len(got) == len(expected)
        for g, e in zip(got, expected, strict=True):
            _assert_same_state(g, e)
    else:
        assert got == expected


def test_lr_find_restores_weights_optimizer_and_step_count():
    learn = _learner()
    learn.fit(1)
    weights = copy.deepcopy(learn.model.state_dict())
    opt_state = copy.deepcopy(learn.opt.state_dict())
    step = learn.training_step

    result = learn.lr_find(num_it=30)

    assert len(result.lrs) > 5  # the sweep really trained
    _assert_same_state(learn.model.state_dict(), weights)
    _assert_same_state(learn.opt.state_dict(), opt_state)
    assert learn.training_step == step
    assert learn.opt.param_groups[0]["lr"] == 1e-3


def test_lr_find_then_fit_trains_exactly_like_fit_alone():
    # Shuffling and dropout draw from the global generator: the sweep must give its state back.
    swept, plain = _learner(), _learner()
    torch.manual_seed(1)
    swept.lr_find(num_it=20)
    swept.fit(1)
    torch.manual_seed(1)
    plain.fit(1)
    for p, q in zip(swept.model.parameters(), plain.model.parameters(), strict=True):
        assert torch.equal(p, q)


def test_lr_find_gives_back_a_seeded_loaders_generator_and_numpy_random_state():
    # digits_loaders-style loaders shuffle with their own generator, which torch's global state misses.
    def learner():
        learn = _learner()
        train = learn.dls.train
        shuffled = torch.Generator().manual_seed(3)
        learn.dls.train = DataLoader(train.dataset, batch_size=16, shuffle=True, generator=shuffled)
        return learn

    swept, plain = learner(), learner()
    torch.manual_seed(1)
    np.random.seed(5)
    swept.lr_find(num_it=20)
    assert np.random.rand() == np.random.RandomState(5).rand()
    swept.fit(1)
    torch.manual_seed(1)
    plain.fit(1)
    for p, q in zip(swept.model.parameters(), plain.model.parameters(), strict=True):
        assert torch.equal(p, q)


def test_sweep_is_exponential_from_start_to_end_over_num_it_batches():
    learn = _learner()
    result = learn.lr_find(start_lr=1e-5, end_lr=1e-1, num_it=20, stop_div=False)

    assert isinstance(result, LRFindResult)
    assert len(result.lrs) == len(result.losses) == len(result.smoothed) == 20  # spans 3 epochs of 8
    assert result.lrs[0] == pytest.approx(1e-5)
    assert result.lrs[-1] == pytest.approx(1e-1)
    ratios = np.diff(np.log(result.lrs))
    assert ratios == pytest.approx(np.full(19, math.log(1e4) / 19))


def test_sweep_stops_when_the_loss_diverges_and_suggests_a_stable_lr():
    learn = _learner(opt_func=torch.optim.SGD)
    result = learn.lr_find(start_lr=1e-4, end_lr=1e3, num_it=100)

    assert len(result.lrs) < 100
    assert result.smoothed[-1] > 4 * min(result.smoothed)
    diverging_lr = result.lrs[int(np.argmin(result.smoothed))]
    assert 1e-4 < result.suggested_lr < diverging_lr
    assert set(result.suggestions) == {"valley", "steepest", "minimum"}
    assert result.suggestions["minimum"] <= diverging_lr / 10  # the last 5 points are trimmed away


def test_scheduling_and_stopping_callbacks_sit_out_the_sweep_and_come_back():
    one_cycle, stopper = OneCycle(0.1), EarlyStopping(patience=1)
    learn = _learner(cbs=[one_cycle, stopper])
    order = list(learn.cbs)
    result = learn.lr_find(start_lr=1e-6, end_lr=1e-2, num_it=24, stop_div=False)

    assert len(result.lrs) == 24  # EarlyStopping did not cut the 3-epoch sweep short
    assert result.lrs == pytest.approx(list(np.geomspace(1e-6, 1e-2, 24)))  # OneCycle did not set them
    assert learn.cbs == order
    assert learn.one_cycle is one_cycle and learn.early_stopping is stopper


class StepCounter(hs.Callback):
    """A callback of the user's that, like the built-in loggers, must not count a sweep's steps."""

    run_during_sweep = False

    def __init__(self):
        self.steps = 0

    def after_step(self):
        self.steps += 1


def test_callbacks_that_record_the_run_sit_out_the_sweep_and_run_again_after_it(tmp_path):
    logger, counter = hs.callbacks.MetricsLogger(tmp_path, every=1), StepCounter()
    learn = _learner(cbs=[logger, counter])
    order = list(learn.cbs)
    learn.lr_find(num_it=12)

    assert counter.steps == 0
    assert not (tmp_path / "metrics.csv").exists()
    assert learn.cbs == order
    assert learn.metrics_logger is logger and learn.step_counter is counter
    assert logger.learn is learn and counter.learn is learn

    learn.fit(1)  # 8 batches
    assert counter.steps == 8
    assert [r["step"] for r in read_metrics(tmp_path) if r["kind"] == "step"] == list(range(1, 9))


def test_a_sweep_that_diverges_gives_the_doctor_nothing_to_diagnose():
    doctor = hs.callbacks.Doctor(quiet=True)
    learn = _learner(opt_func=torch.optim.SGD, cbs=[doctor])
    learn.lr_find(start_lr=1e-4, end_lr=1e3, num_it=100)  # ends far past divergence
    assert doctor.findings == []
    assert learn.doctor is doctor


def test_the_sweeping_check_is_deprecated():
    learn = _learner()
    with pytest.warns(DeprecationWarning, match="run_during_sweep = False"):
        assert sweeping(learn) is False


def test_lr_find_creates_the_optimizer_when_none_exists_yet():
    learn = _learner()
    assert learn.opt is None
    learn.lr_find(num_it=10)
    assert learn.opt is not None
    assert not learn.opt.state  # restored to its fresh, never-stepped state


def test_plot_returns_a_log_scale_figure_of_the_smoothed_loss():
    result = _learner(opt_func=torch.optim.SGD).lr_find(start_lr=1e-3, end_lr=10.0, num_it=30)
    fig = result.plot()

    assert isinstance(fig, Figure)
    (ax,) = fig.axes
    assert ax.get_xscale() == "log"
    line = ax.get_lines()[0]
    assert list(line.get_xdata()) == result.lrs
    assert list(line.get_ydata()) == result.smoothed
    assert ax.get_ylim()[1] < 2.1 * result.smoothed[0]  # the blow-up does not set the scale


def test_plot_draws_into_a_given_axes():
    result = _learner().lr_find(num_it=20, stop_div=False)
    fig = Figure()
    ax = fig.add_subplot()
    assert result.plot(ax) is fig
    assert [line.get_label() for line in ax.get_lines()] == ["smoothed loss", "valley", "steepest", "minimum"]


def test_valley_suggestion_is_halfway_down_the_longest_descent():
    lrs = list(np.geomspace(1e-6, 1.0, 100))
    # Flat, then falling from index 20 to 70, then blowing up.
    losses = [2.0] * 20 + list(np.linspace(2.0, 0.5, 51)) + list(np.linspace(0.6, 5.0, 29))
    suggestions = suggest_lrs(lrs, losses)
    assert lrs[40] <= suggestions["valley"] <= lrs[50]
    assert suggestions["minimum"] == pytest.approx(lrs[70] / 10)
    assert lrs[20] <= suggestions["steepest"] <= lrs[70]


def test_suggestions_need_a_usable_sweep():
    with pytest.raises(ValueError, match="usable points"):
        suggest_lrs([1e-3, 1e-2, 1e-1], [1.0, math.nan, math.nan])


def test_lr_finder_rejects_bad_ranges():
    with pytest.raises(ValueError, match="start_lr < end_lr"):
        LRFinder(start_lr=1.0, end_lr=1e-3)
    with pytest.raises(ValueError, match="num_it=1"):
        LRFinder(num_it=1)


def test_learn_lr_finder_exists_only_during_the_sweep():
    class SeesFinder(hs.Callback):
        def __init__(self):
            self.seen = []

        def before_fit(self):
            self.seen.append(getattr(self.learn, "lr_finder", None))

    probe = SeesFinder()
    learn = _learner(cbs=[probe])
    learn.lr_find(num_it=10)
    learn.fit(1)
    assert isinstance(probe.seen[0], LRFinder)
    assert probe.seen[1] is None
    assert not hasattr(learn, "lr_finder")


def test_a_diverging_sweep_gives_the_loss_scale_back():
    precision = MixedPrecision(torch.float16, init_scale=2.0**8)
    learn = _learner(opt_func=torch.optim.SGD, cbs=[precision])
    learn.fit(1)
    scale = precision.scaler.get_scale()

    learn.lr_find(start_lr=1e-2, end_lr=1e6, num_it=30, stop_div=False)  # ends in inf/NaN losses
    assert precision.skipped_steps == 0
    assert precision.scaler.get_scale() == scale


def test_a_sweep_ending_inside_an_accumulation_group_leaves_no_gradient_behind():
    learn = _learner(cbs=[GradientAccumulation(4)])
    learn.lr_find(num_it=6, stop_div=False)  # stops after batch 6: two batches into the second group
    assert all(p.grad is None for p in learn.model.parameters())
