import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hookscope as hs
from hookscope.callbacks import GradientClip, GradientClipValue, MixedPrecision


def _learner(cbs):
    torch.manual_seed(0)
    x = torch.randn(64, 8)
    y = 100 * x @ torch.randn(8, 1)  # large targets: gradient norms in the hundreds
    dl = DataLoader(TensorDataset(x, y), batch_size=16)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    return hs.Learner(
        model, (dl, None), nn.MSELoss(), opt_func=torch.optim.SGD, lr=1e-3, cbs=cbs, progress=False
    )


def _grads(model):
    return [p.grad for p in model.parameters() if p.grad is not None]


class GradProbe(hs.Callback):
    """Records the gradients' total norm and max |element| when the optimizer is about to step."""

    order = 1000

    def __init__(self):
        self.norms, self.maxes = [], []

    def before_step(self):
        grads = _grads(self.learn.model)
        self.norms.append(float(torch.nn.utils.get_total_norm(grads)))
        self.maxes.append(max(float(g.abs().max()) for g in grads))


class ScaledGradProbe(hs.Callback):
    """Records the gradient norm right after backward, before anything unscales or clips."""

    def __init__(self):
        self.norms = []

    def after_backward(self):
        self.norms.append(float(torch.nn.utils.get_total_norm(_grads(self.learn.model))))


def test_gradient_clip_bounds_the_total_norm_at_the_step():
    probe = GradProbe()
    clip = GradientClip(max_norm=0.5)
    learn = _learner([clip, probe])
    learn.fit(2)

    assert len(probe.norms) == 8
    assert max(probe.norms) <= 0.5 * (1 + 1e-5)
    assert float(clip.last_norm) > 0.5  # the unclipped norm: clipping really happened


def test_gradient_clip_with_other_norm_types():
    probe = GradProbe()
    learn = _learner([GradientClip(max_norm=0.1, norm_type=float("inf")), probe])
    learn.fit(1)
    assert max(probe.maxes) <= 0.1 * (1 + 1e-5)


def test_gradient_clip_value_clamps_every_element():
    probe = GradProbe()
    learn = _learner([GradientClipValue(0.01), probe])
    learn.fit(1)
    assert max(probe.maxes) == pytest.approx(0.01)


def test_gradient_clip_sees_unscaled_gradients_under_fp16_grad_scaler():
    scale = 4.0  # small enough that these large gradients stay finite in float16
    after_backward = ScaledGradProbe()
    clip = GradientClip(max_norm=0.5)
    probe = GradProbe()
    precision = MixedPrecision(torch.float16, init_scale=scale)
    learn = _learner([clip, probe, after_backward, precision])
    learn.fit(1)

    assert precision.skipped_steps == 0
    true_norm = after_backward.norms[-1] / scale
    assert float(clip.last_norm) == pytest.approx(true_norm, rel=1e-3)
    assert max(probe.norms) <= 0.5 * (1 + 1e-3)


def test_gradient_clip_rejects_non_positive_thresholds():
    with pytest.raises(ValueError, match="max_norm=0"):
        GradientClip(0)
    with pytest.raises(ValueError, match="value=-1"):
        GradientClipValue(-1)
