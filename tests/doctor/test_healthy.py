"""Healthy models train for an epoch without a single finding: the thresholds are not trigger-happy."""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchvision.models import resnet18

import hookscope as hs
from hookscope.data.digits import digits_loaders, digits_tensors
from hookscope.models import digits_cnn, mlp


def _fit_one_epoch(model, train_dl, valid_dl=None, lr=1e-3):
    doctor = hs.callbacks.Doctor(quiet=True)
    learn = hs.Learner(
        model, (train_dl, valid_dl), nn.CrossEntropyLoss(), lr=lr, cbs=[doctor], progress=False
    )
    learn.fit(1)
    assert learn.training_step == len(train_dl)
    return doctor


def test_digits_cnn_one_epoch_is_quiet():
    torch.manual_seed(0)
    train_dl, valid_dl = digits_loaders(batch_size=64)
    doctor = _fit_one_epoch(digits_cnn(), train_dl, valid_dl, lr=3e-3)
    assert doctor.findings == [], doctor.summary()
    assert set(doctor.activations.history) >= {"features.0.2", "head.2"}  # it did watch the layers


def test_mlp_one_epoch_is_quiet():
    torch.manual_seed(0)
    train_dl, valid_dl = digits_loaders(batch_size=64)
    doctor = _fit_one_epoch(mlp((64, 128, 64, 10)), train_dl, valid_dl)
    assert doctor.findings == [], doctor.summary()
    assert len(doctor.gradients.param_history["1.weight"]) == len(train_dl)
    assert "no finding" in doctor.summary()


def test_resnet18_on_upscaled_digits_is_quiet():
    torch.manual_seed(0)
    x, y, _, _ = digits_tensors(size=32)
    subset = TensorDataset(x[:128].repeat(1, 3, 1, 1), y[:128])  # an epoch of 8 batches, RGB-shaped
    doctor = _fit_one_epoch(resnet18(weights=None, num_classes=10), DataLoader(subset, batch_size=16))
    assert doctor.findings == [], doctor.summary()
