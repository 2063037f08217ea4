"""Training curves: what loss_curves and lr_schedule draw from the Recorder's numbers."""

import numpy as np
import pytest

from hookscope.viz.curves import loss_curves, lr_schedule

HISTORY = [
    {"epoch": 0, "train_loss": 2.0, "valid_loss": 1.5, "accuracy": 0.6, "time": 1.0},
    {"epoch": 1, "train_loss": 1.0, "valid_loss": 0.9, "accuracy": 0.8, "time": 1.0},
]


def test_loss_curves_draw_steps_epochs_and_metrics():
    losses = list(np.linspace(2.5, 0.8, 20))
    fig = loss_curves(losses, HISTORY)
    loss_ax, metric_ax = fig.axes
    labels = [line.get_label() for line in loss_ax.lines]
    assert labels == ["train (step)", "train (smoothed)", "train loss (epoch)", "valid loss (epoch)"]
    assert list(loss_ax.lines[3].get_xdata()) == [10, 20]  # epoch values at the step each epoch ended
    assert list(loss_ax.lines[3].get_ydata()) == [1.5, 0.9]
    assert [line.get_label() for line in metric_ax.lines] == ["accuracy"]
    assert loss_ax.get_yscale() == "linear"


def test_smoothed_loss_of_a_constant_is_that_constant():
    fig = loss_curves([0.5] * 30, HISTORY)
    assert np.allclose(fig.axes[0].lines[1].get_ydata(), 0.5)


def test_a_loss_falling_by_decades_gets_a_log_axis_and_no_metrics_no_panel():
    history = [{"epoch": 0, "train_loss": 1.0, "valid_loss": 0.01, "time": 1.0}]
    fig = loss_curves(list(np.geomspace(10, 0.01, 12)), history)
    assert len(fig.axes) == 1 and fig.axes[0].get_yscale() == "log"


def test_lr_schedule_plots_every_step_and_names_the_peak():
    lrs = [1e-4, 1e-3, 3e-3, 1e-3, 1e-5]
    ax = lr_schedule(lrs).axes[0]
    assert list(ax.lines[0].get_ydata()) == lrs
    assert ax.get_title() == "learning rate (peak 0.003)"


def test_nothing_recorded_is_a_clear_error():
    with pytest.raises(ValueError, match="loss_curves: nothing recorded yet"):
        loss_curves([], [])
    with pytest.raises(ValueError, match="lr_schedule: no learning rate recorded yet"):
        lr_schedule([])
