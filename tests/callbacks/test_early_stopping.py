import math

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hookscope as hs
from hookscope.callbacks import EarlyStopping


def _learner(cbs, lr=1e-3):
    torch.manual_seed(0)
    x = torch.randn(32, 4)
    y = x.sum(1, keepdim=True)
    dl = DataLoader(TensorDataset(x, y), batch_size=16)
    return hs.Learner(nn.Linear(4, 1), (dl, dl), nn.MSELoss(), lr=lr, cbs=cbs, progress=False)


class Scripted(hs.Callback):
    """Writes ``values[epoch]`` into the current history row as ``score`` (after the Recorder, before
    EarlyStopping), so the monitored sequence is exactly the one the test scripts."""

    run_after = ("Recorder",)
    run_before = ("EarlyStopping",)

    def __init__(self, values):
        self.values = values

    def after_epoch(self):
        self.learn.recorder.history[-1]["score"] = self.values[self.learn.epoch]


def _run(values, n_epoch=None, **kwargs):
    stopper = EarlyStopping(monitor="score", **kwargs)
    learn = _learner([Scripted(values), stopper])
    learn.fit(n_epoch or len(values))
    return learn, stopper


def test_stops_after_patience_epochs_without_improvement_in_max_mode():
    learn, stopper = _run([0.1, 0.5, 0.4, 0.45, 0.9, 0.95], mode="max", patience=2)
    assert stopper.stopped_epoch == 3
    assert len(learn.recorder.history) == 4
    assert (stopper.best, stopper.best_epoch) == (0.5, 1)


def test_patience_1_stops_at_the_first_epoch_without_improvement():
    learn, stopper = _run([3.0, 2.0, 1.0, 1.5, 0.1], mode="min", patience=1)
    assert stopper.stopped_epoch == 3
    assert [row["epoch"] for row in learn.recorder.history] == [0, 1, 2, 3]


def test_callbacks_ordered_late_still_see_the_final_epoch():
    class LateEpochLog(hs.Callback):
        order = 90  # like the progress bar and the checkpoint callback

        def __init__(self):
            self.epochs = []

        def after_epoch(self):
            self.epochs.append(self.learn.epoch)

    log = LateEpochLog()
    stopper = EarlyStopping(monitor="score", patience=1)
    learn = _learner([Scripted([3.0, 4.0, 1.0]), stopper, log])
    learn.fit(3)
    assert stopper.stopped_epoch == 1
    assert log.epochs == [0, 1]


def test_an_improvement_resets_the_count():
    _, stopper = _run([5.0, 6.0, 4.0, 6.0, 3.0, 6.0, 7.0], mode="min", patience=2)
    assert stopper.stopped_epoch == 6
    assert (stopper.best, stopper.best_epoch) == (3.0, 4)


def test_min_delta_ignores_improvements_that_are_too_small():
    _, stopper = _run([1.0, 0.96, 0.97, 0.5], mode="min", patience=2, min_delta=0.05)
    assert stopper.stopped_epoch == 2
    assert stopper.best == 1.0


def test_nan_never_improves():
    _, stopper = _run([1.0, math.nan, math.nan, 0.1], mode="min", patience=2)
    assert stopper.stopped_epoch == 2


def test_runs_every_epoch_while_improving():
    learn, stopper = _run([4.0, 3.0, 2.0, 1.0], mode="min", patience=1)
    assert stopper.stopped_epoch is None
    assert len(learn.recorder.history) == 4


def test_monitors_the_real_valid_loss_by_default():
    stopper = EarlyStopping(patience=2)
    learn = _learner([stopper], lr=0.0)  # lr 0: the valid loss never changes, so never improves
    learn.fit(10)
    assert stopper.stopped_epoch == 2
    assert stopper.best == learn.recorder.history[0]["valid_loss"]


def test_a_new_fit_starts_counting_afresh_but_a_loaded_state_resumes():
    stopper = EarlyStopping(monitor="score", mode="max", patience=2)
    learn = _learner([Scripted([1.0, 0.5, 0.5, 0.5]), stopper])
    learn.fit(2)
    assert (stopper.best, stopper.wait) == (1.0, 1)
    state = stopper.state_dict()

    learn.fit(2)  # fresh: epoch 0 scores 1.0 again and sets the best, epoch 1 waits once
    assert (stopper.stopped_epoch, stopper.wait) == (None, 1)

    stopper.load_state_dict(state)
    learn.recorder.history.clear()
    learn.fit(2)  # resumed: epoch 0's 1.0 does not beat the loaded best, so the count reaches 2
    assert stopper.stopped_epoch == 0


def test_a_missing_monitor_names_what_is_available():
    learn = _learner([EarlyStopping(monitor="accuracy")])
    with pytest.raises(KeyError, match=r"monitor='accuracy'.*available: train_loss, valid_loss"):
        learn.fit(1)


def test_without_validation_data_only_train_loss_can_be_monitored():
    x = torch.randn(32, 4)
    dl = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=16)

    def learner(cb):
        return hs.Learner(nn.Linear(4, 1), (dl, None), nn.MSELoss(), lr=0.0, cbs=[cb], progress=False)

    with pytest.raises(ValueError, match=r"monitor='valid_loss' is measured on validation data"):
        learner(EarlyStopping()).fit(1)
    stopper = EarlyStopping(monitor="train_loss", patience=1)
    learner(stopper).fit(5)
    assert stopper.stopped_epoch == 1  # lr 0: the train loss never improves after epoch 0


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="mode='best'"):
        EarlyStopping(mode="best")
    with pytest.raises(ValueError, match="patience=0"):
        EarlyStopping(patience=0)
    with pytest.raises(ValueError, match=r"min_delta=-0\.1"):
        EarlyStopping(min_delta=-0.1)
