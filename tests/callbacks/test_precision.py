import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hookscope as hs
from hookscope.callbacks import MixedPrecision
from hookscope.train.events import CancelBatchException, CancelFitException


def _learner(cbs, lr=1e-2, epochs_data=128):
    torch.manual_seed(0)
    x = torch.randn(epochs_data, 16)
    y = (x[:, :4].sum(1) > 0).long()
    train = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
    valid = DataLoader(TensorDataset(x, y), batch_size=64)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    return hs.Learner(model, (train, valid), nn.CrossEntropyLoss(), lr=lr, cbs=cbs, progress=False)


class AutocastProbe(hs.Callback):
    """Records whether autocast is on at after_pred (it must be) and after_batch (it must not be)."""

    order = 100

    def __init__(self):
        self.in_pred, self.in_after_batch, self.pred_dtypes = [], [], []

    def after_pred(self):
        self.in_pred.append(torch.is_autocast_enabled("cpu"))
        self.pred_dtypes.append(self.learn.pred.dtype)

    def after_batch(self):
        self.in_after_batch.append(torch.is_autocast_enabled("cpu"))


def test_bf16_on_cpu_runs_the_forward_in_bf16_and_trains():
    probe = AutocastProbe()
    learn = _learner([MixedPrecision(), probe])
    layer_dtypes = []
    learn.model[0].register_forward_hook(lambda mod, inp, out: layer_dtypes.append(out.dtype))
    learn.fit(4)

    assert learn.mixed_precision.dtype == torch.bfloat16
    assert learn.mixed_precision.scaler is None  # bf16 needs no loss scaling
    assert set(layer_dtypes) == {torch.bfloat16}
    assert set(probe.pred_dtypes) == {torch.float32}  # predictions handed to loss/metrics in float32
    assert all(probe.in_pred) and not any(probe.in_after_batch)
    losses = [row["train_loss"] for row in learn.recorder.history]
    assert losses[-1] < 0.6 * losses[0]
    assert not torch.is_autocast_enabled("cpu")


def test_fp16_with_grad_scaler_on_cpu_trains():
    precision = MixedPrecision(torch.float16)
    learn = _learner([precision])
    learn.fit(4)

    assert isinstance(precision.scaler, torch.amp.GradScaler)
    assert precision.scaler.get_scale() == 2.0**16
    assert precision.skipped_steps == 0
    losses = [row["train_loss"] for row in learn.recorder.history]
    assert losses[-1] < 0.6 * losses[0]


def test_overflowing_steps_are_skipped_and_training_recovers():
    # 2**22 times a loss near 0.7 overflows float16 gradients; halving the scale a few times fixes that.
    precision = MixedPrecision(torch.float16, init_scale=2.0**22)
    learn = _learner([precision])
    before = [p.detach().clone() for p in learn.model.parameters()]
    learn.fit(2)

    assert 0 < precision.skipped_steps < 2 * 4
    assert learn.training_step == 2 * 4 - precision.skipped_steps
    assert precision.scaler.get_scale() == 2.0 ** (22 - precision.skipped_steps)
    after = list(learn.model.parameters())
    assert all(torch.isfinite(p).all() for p in after)
    assert any(not torch.equal(a, b) for a, b in zip(after, before, strict=True))


def test_the_first_skipped_step_leaves_the_weights_untouched():
    precision = MixedPrecision(torch.float16, init_scale=2.0**80)
    learn = _learner([precision])
    before = [p.detach().clone() for p in learn.model.parameters()]
    learn.fit(1, cbs=[_StopAfterFirstBatch()])
    assert precision.skipped_steps == 1
    assert all(torch.equal(a, b) for a, b in zip(learn.model.parameters(), before, strict=True))


class _StopAfterFirstBatch(hs.Callback):
    order = 200

    def after_batch(self):
        raise CancelFitException()


def test_autocast_is_left_when_a_batch_is_cancelled_after_the_forward():
    class CancelAfterPred(hs.Callback):
        order = 50

        def after_pred(self):
            if self.learn.iter % 2 == 0:
                raise CancelBatchException()

    probe = AutocastProbe()
    learn = _learner([MixedPrecision(), CancelAfterPred(), probe])
    learn.fit(1)
    assert probe.in_after_batch and not any(probe.in_after_batch)
    assert not torch.is_autocast_enabled("cpu")


def test_autocast_is_left_when_the_forward_fails():
    class Boom(nn.Linear):
        def forward(self, x):
            raise RuntimeError("boom")

    learn = _learner([MixedPrecision()])
    learn.model = Boom(16, 2)
    with pytest.raises(RuntimeError, match="boom"):
        learn.fit(1)
    assert not torch.is_autocast_enabled("cpu")


def test_a_fit_stopped_after_the_unscale_leaves_the_scaler_ready_for_the_next_fit():
    class StopAtStep(hs.Callback):
        order = 50  # after MixedPrecision has unscaled the gradients

        def before_step(self):
            raise CancelFitException()

    precision = MixedPrecision(torch.float16)
    learn = _learner([precision])
    learn.fit(1, cbs=[StopAtStep()])
    learn.fit(1)  # a stale unscale would make GradScaler raise here
    assert learn.training_step == 4


def test_scaler_state_round_trips_through_state_dict():
    first = MixedPrecision(torch.float16, init_scale=2.0**80)
    _learner([first]).fit(1)
    state = first.state_dict()
    assert state["scaler"]["scale"] == first.scaler.get_scale() < 2.0**80

    resumed = MixedPrecision(torch.float16)
    resumed.load_state_dict(state)
    _learner([resumed]).fit(1, cbs=[_StopAfterFirstBatch()])
    # The loaded scale (not the default 2**16) still overflows: one more skip, half the scale.
    assert resumed.skipped_steps == first.skipped_steps + 1
    assert resumed.scaler.get_scale() == first.scaler.get_scale() / 2


def test_mixed_precision_rejects_a_full_precision_dtype():
    with pytest.raises(ValueError, match=r"dtype=torch\.float32"):
        MixedPrecision(torch.float32)
