import math

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hookscope as hs
from hookscope.train.events import (
    CancelEpochException,
    CancelFitException,
    CancelTrainException,
    CancelValidException,
)


def _learner(n=40, batch_size=8, valid=True, metrics=(), **kwargs):
    torch.manual_seed(0)
    x, y = torch.randn(n, 4), torch.randint(0, 3, (n,))
    train = DataLoader(TensorDataset(x, y), batch_size=batch_size)
    valid_dl = DataLoader(TensorDataset(x[:10], y[:10]), batch_size=4) if valid else None
    dls = hs.DataLoaders(train, valid_dl)
    return hs.Learner(nn.Linear(4, 3), dls, nn.CrossEntropyLoss(), metrics=metrics, progress=False, **kwargs)


def test_losses_and_lrs_have_one_entry_per_training_step():
    learn = _learner(lr=0.01)
    learn.fit(3)
    assert len(learn.recorder.losses) == 15 == len(learn.recorder.lrs)
    assert learn.recorder.lrs == [0.01] * 15
    assert all(isinstance(v, float) for v in learn.recorder.losses)


def test_train_loss_is_the_batch_size_weighted_mean_of_the_step_losses():
    learn = _learner(n=20, batch_size=8)  # batches of 8, 8, 4
    learn.fit(1)
    losses = learn.recorder.losses
    expected = (8 * losses[0] + 8 * losses[1] + 4 * losses[2]) / 20
    assert learn.recorder.history[0]["train_loss"] == pytest.approx(expected, rel=1e-6)


def test_smooth_loss_is_the_debiased_exponential_average():
    learn = _learner()
    learn.fit(2)
    beta, average = learn.recorder.beta, 0.0
    for loss in learn.recorder.losses:
        average = beta * average + (1 - beta) * loss
    expected = average / (1 - beta ** len(learn.recorder.losses))
    assert learn.recorder.smooth_loss == pytest.approx(expected, rel=1e-5)


def test_smooth_loss_read_midway_gives_the_same_final_value():
    class ReadEveryStep(hs.Callback):
        order = 10

        def after_batch(self):
            if self.learn.training:
                self.learn.recorder.smooth_loss  # noqa: B018 (reading folds losses in)

    torch.manual_seed(0)
    read = _learner(cbs=[ReadEveryStep()])
    read.fit(2)
    untouched = _learner()
    untouched.fit(2)
    assert read.recorder.smooth_loss == pytest.approx(untouched.recorder.smooth_loss, rel=1e-6)


def test_no_validation_data_gives_nan_valid_values():
    learn = _learner(valid=False, metrics=[hs.metrics.accuracy])
    learn.fit(1)
    row = learn.recorder.history[0]
    assert math.isnan(row["valid_loss"]) and math.isnan(row["accuracy"])
    assert not math.isnan(row["train_loss"])


def test_a_torchmetrics_metric_matches_the_function_metric():
    torchmetrics = pytest.importorskip("torchmetrics")
    metric = torchmetrics.classification.MulticlassAccuracy(num_classes=3, average="micro")
    learn = _learner(metrics=[hs.metrics.accuracy, metric])
    learn.fit(1)
    row = learn.recorder.history[0]
    assert row["multiclass_accuracy"] == pytest.approx(row["accuracy"])


def test_duplicate_metric_names_are_refused():
    learn = _learner(metrics=[hs.metrics.accuracy, hs.metrics.accuracy])
    with pytest.raises(ValueError, match="not unique"):
        learn.fit(1)


def test_history_starts_afresh_each_fit_unless_restored():
    learn = _learner()
    learn.fit(2)
    state = learn.recorder.state_dict()
    learn.fit(1)
    assert len(learn.recorder.history) == 1
    learn.recorder.load_state_dict(state)
    assert len(learn.recorder.history) == 2 and len(learn.recorder.losses) == 10
    learn.fit(1)
    assert [row["epoch"] for row in learn.recorder.history] == [0, 1, 0]
    assert len(learn.recorder.losses) == 15


def test_many_steps_are_compacted_without_losing_any():
    x, y = torch.randn(1100, 2), torch.randn(1100, 1)
    learn = hs.Learner(
        nn.Linear(2, 1), (DataLoader(TensorDataset(x, y), batch_size=1),), nn.MSELoss(), progress=False
    )
    learn.fit(1)
    losses = learn.recorder.losses
    assert len(losses) == 1100


@pytest.mark.parametrize("in_memory", [True, False])
def test_no_host_reads_per_step(monkeypatch, in_memory):
    """Host reads of tensor values (device syncs on accelerators) happen per epoch, never per step.

    SGD: torch's Adam reads its CPU step counter with ``.item()`` (no device sync, but it would count here).
    """
    reads = []
    for name in ("item", "tolist", "__float__", "__int__", "__bool__"):
        original = getattr(torch.Tensor, name)

        def counting(self, *args, _original=original, _name=name):
            reads.append(_name)
            return _original(self, *args)

        monkeypatch.setattr(torch.Tensor, name, counting)

    def reads_during_fit(n_batches):
        torch.manual_seed(0)
        x, y = torch.randn(8 * n_batches, 4), torch.randint(0, 3, (8 * n_batches,))
        loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
        dls = hs.DataLoaders(loader, loader, in_memory=in_memory)
        learn = hs.Learner(
            nn.Linear(4, 3),
            dls,
            nn.CrossEntropyLoss(),
            opt_func=torch.optim.SGD,
            metrics=[hs.metrics.accuracy],
            progress=False,
        )
        reads.clear()
        learn.fit(2)
        return len(reads)

    assert reads_during_fit(3) == reads_during_fit(12)


class _StopAtStep(hs.Callback):
    order = 100

    def __init__(self, step):
        self.step = step

    def after_batch(self):
        if self.learn.training_step == self.step:
            raise CancelFitException()


def test_a_run_resumed_mid_epoch_records_what_the_uninterrupted_run_records(tmp_path):
    def learner(folder, extra=()):
        torch.manual_seed(0)
        x, y = torch.randn(40, 4), torch.randint(0, 3, (40,))
        train = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True, generator=torch.Generator())
        train.generator.manual_seed(1)
        valid = DataLoader(TensorDataset(x[:16], y[:16]), batch_size=8)
        save = hs.callbacks.Checkpoint(folder, every_n_steps=3, sigint=False)
        return hs.Learner(
            nn.Linear(4, 3), (train, valid), nn.CrossEntropyLoss(), cbs=[save, *extra], progress=False
        )

    full = learner(tmp_path / "full")
    full.fit(3)
    learner(tmp_path / "cut", [_StopAtStep(7)]).fit(3)  # last checkpoint: step 6, mid-epoch 1
    resumed = learner(tmp_path / "cut")
    resumed.fit(3, resume=tmp_path / "cut")

    assert len(resumed.recorder.history) == 3
    for got, want in zip(resumed.recorder.history, full.recorder.history, strict=True):
        del got["time"], want["time"]
        assert got == pytest.approx(want)
    assert resumed.recorder.losses == pytest.approx(full.recorder.losses)
    assert resumed.recorder.smooth_loss == pytest.approx(full.recorder.smooth_loss)


def test_loading_records_then_a_fresh_fit_ignores_a_partial_epoch():
    learn = _learner()
    learn.fit(1)
    state = learn.recorder.state_dict()
    state["epoch_losses"], state["epoch_sizes"] = [100.0], [8]  # as if saved mid-epoch
    learn.recorder.load_state_dict(state)
    learn.fit(1)
    fresh_epoch = learn.recorder.losses[5:]  # five equal batches of 8
    assert learn.recorder.history[-1]["train_loss"] == pytest.approx(sum(fresh_epoch) / 5, rel=1e-6)


def test_an_epoch_cancelled_before_the_recorder_sees_it_gets_a_nan_row():
    class SkipOddEpochs(hs.Callback):
        order = -100  # before the Recorder

        def before_epoch(self):
            if self.learn.epoch % 2:
                raise CancelEpochException()

    learn = _learner(cbs=[SkipOddEpochs()])
    learn.fit(3)
    history = learn.recorder.history
    assert [row["epoch"] for row in history] == [0, 1, 2]
    assert math.isnan(history[1]["train_loss"]) and math.isnan(history[1]["valid_loss"])
    assert not math.isnan(history[2]["train_loss"])


class _SkipSecondTraining(hs.Callback):
    order = -100  # before the Recorder

    def before_train(self):
        if self.learn.epoch == 1:
            raise CancelTrainException()


class _SkipSecondValidation(hs.Callback):
    order = -100

    def before_validate(self):
        if self.learn.epoch == 1:
            raise CancelValidException()


@pytest.mark.parametrize(
    ("skipper", "skipped", "kept"),
    [
        (_SkipSecondTraining, ["train_loss"], "valid_loss"),
        (_SkipSecondValidation, ["valid_loss", "accuracy"], "train_loss"),
    ],
)
def test_a_phase_cancelled_before_the_recorder_sees_it_is_nan_not_the_other_phase(skipper, skipped, kept):
    learn = _learner(cbs=[skipper()], metrics=[hs.metrics.accuracy])
    learn.fit(2)
    row = learn.recorder.history[1]
    assert all(math.isnan(row[key]) for key in skipped)
    assert not math.isnan(row[kept])


class RecordsBatchIndex(hs.Callback):
    """Records ``iter`` of every training batch, and its square while validating in the first epoch."""

    def after_batch(self):
        learn = self.learn
        if learn.training:
            learn.recorder.record(index=torch.tensor(float(learn.iter)))
        elif learn.epoch == 0:
            learn.recorder.record(square=float(learn.iter) ** 2)


def test_record_adds_a_callbacks_values_to_the_history_as_batch_size_weighted_means():
    learn = _learner(n=20, batch_size=8, cbs=[RecordsBatchIndex()])  # batches of 8, 8, 4; valid 4, 4, 2
    learn.fit(2)
    first, second = learn.recorder.history
    assert first["index"] == second["index"] == pytest.approx((8 * 0 + 8 * 1 + 4 * 2) / 20)
    assert first["valid_square"] == pytest.approx((4 * 0 + 4 * 1 + 2 * 4) / 10)
    assert math.isnan(second["valid_square"])  # nothing recorded under that name in epoch 1
    assert list(second) == ["epoch", "train_loss", "valid_loss", "index", "valid_square", "time"]


def test_the_recorder_moved_beside_the_loop_and_its_old_module_path_warns():
    from hookscope.train.recorder import Recorder

    assert hs.callbacks.Recorder is Recorder
    with pytest.warns(DeprecationWarning, match="moved to hookscope.train.recorder"):
        from hookscope.callbacks.recorder import Recorder as old_path
    assert old_path is Recorder
