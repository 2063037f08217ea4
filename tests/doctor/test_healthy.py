"""Healthy models train without a single finding: the thresholds are not trigger-happy.

One epoch of the reference models, and three epochs of each model the issue names, at sensible settings,
with the Doctor at its defaults (the adaptive schedule and every rule, the loss rules included).
"""

import pytest
import torch
from test_preflight import Encoder, LSTMClassifier, _sequences
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchvision.models import mobilenet_v3_small, resnet18

import hookscope as hs
from hookscope.data.digits import digits_loaders, digits_tensors
from hookscope.models import digits_cnn, mlp


def _fit(model, train_dl, valid_dl=None, lr=1e-3, epochs=1, loss_func=None):
    doctor = hs.callbacks.Doctor(quiet=True)
    loss_func = loss_func or nn.CrossEntropyLoss()
    learn = hs.Learner(model, (train_dl, valid_dl), loss_func, lr=lr, cbs=[doctor], progress=False)
    learn.fit(epochs)
    assert learn.training_step == epochs * len(train_dl)
    return doctor


def test_digits_cnn_one_epoch_is_quiet():
    torch.manual_seed(0)
    train_dl, valid_dl = digits_loaders(batch_size=64)
    doctor = _fit(digits_cnn(), train_dl, valid_dl, lr=3e-3)
    assert doctor.findings == [], doctor.summary()
    assert set(doctor.activations.history) >= {"features.0.2", "head.2"}  # it did watch the layers


def test_mlp_one_epoch_is_quiet():
    torch.manual_seed(0)
    train_dl, valid_dl = digits_loaders(batch_size=64)
    doctor = _fit(mlp((64, 128, 64, 10)), train_dl, valid_dl)
    assert doctor.findings == [], doctor.summary()
    recorded = [r.step for r in doctor.gradients.param_history["1.weight"]]
    assert recorded == list(range(5))  # the schedule: every step of the first 5, then every 50th
    assert "no finding" in doctor.summary()


def test_resnet18_on_upscaled_digits_is_quiet():
    torch.manual_seed(0)
    x, y, _, _ = digits_tensors(size=32)
    subset = TensorDataset(x[:128].repeat(1, 3, 1, 1), y[:128])  # an epoch of 8 batches, RGB-shaped
    gen = torch.Generator().manual_seed(0)  # a training loader that reads in order is named (info)
    loader = DataLoader(subset, batch_size=16, shuffle=True, generator=gen)
    doctor = _fit(resnet18(weights=None, num_classes=10), loader)
    assert doctor.findings == [], doctor.summary()


# ---- three epochs of each model the issue names ------------------------------------------------------


def _upscaled_digits(n: int = 512) -> tuple[DataLoader, DataLoader]:
    """Digits upscaled to 3x32x32: ``n`` to train on (batches of 16), 128 to validate."""
    x, y, x_valid, y_valid = digits_tensors(size=32)
    train = TensorDataset(x[:n].repeat(1, 3, 1, 1), y[:n])
    valid = TensorDataset(x_valid[:128].repeat(1, 3, 1, 1), y_valid[:128])
    gen = torch.Generator().manual_seed(0)
    return DataLoader(train, batch_size=16, shuffle=True, generator=gen), DataLoader(valid, batch_size=64)


def _quiet_for_three_epochs(model, loaders, lr, loss_func=None):
    doctor = _fit(model, *loaders, lr=lr, epochs=3, loss_func=loss_func)
    assert doctor.findings == [], doctor.summary()
    assert len(doctor.engine.loss_history) >= 2 * doctor.thresholds.stall_window  # the loss rules had a say


@pytest.mark.slow
def test_digits_cnn_three_epochs_is_quiet():
    torch.manual_seed(0)
    _quiet_for_three_epochs(digits_cnn(), digits_loaders(batch_size=64), lr=3e-3)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # ~15 min seen under a load of 19 on 2 cores (default limit: 900 s)
@pytest.mark.parametrize("build", [resnet18, mobilenet_v3_small])
def test_torchvision_models_on_upscaled_digits_three_epochs_are_quiet(build):
    torch.manual_seed(0)
    _quiet_for_three_epochs(build(weights=None, num_classes=10), _upscaled_digits(), lr=1e-3)


def _sequence_loaders() -> tuple[DataLoader, DataLoader]:
    x, y = _sequences(n=1280)
    gen = torch.Generator().manual_seed(0)
    train = DataLoader(TensorDataset(x[:1024], y[:1024]), batch_size=32, shuffle=True, generator=gen)
    return train, DataLoader(TensorDataset(x[1024:], y[1024:]), batch_size=128)


@pytest.mark.slow
@pytest.mark.parametrize("build", [Encoder, LSTMClassifier])
def test_sequence_classifiers_three_epochs_are_quiet(build):
    torch.manual_seed(0)
    _quiet_for_three_epochs(build(), _sequence_loaders(), lr=3e-3)


@pytest.mark.slow
def test_mlp_regression_three_epochs_is_quiet():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1280, 8, generator=gen)
    y = x[:, :1] * 2 + torch.sin(3 * x[:, 1:2])
    y = (y - y.mean()) / y.std()
    train = DataLoader(TensorDataset(x[:1024], y[:1024]), batch_size=32, shuffle=True, generator=gen)
    valid = DataLoader(TensorDataset(x[1024:], y[1024:]), batch_size=256)
    torch.manual_seed(0)
    _quiet_for_three_epochs(mlp((8, 64, 64, 1)), (train, valid), lr=3e-3, loss_func=nn.MSELoss())
