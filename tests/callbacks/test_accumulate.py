import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hookscope as hs
from hookscope.callbacks import GradientAccumulation, MixedPrecision

torch.manual_seed(0)
X = torch.randn(64, 6)
Y = (X @ torch.randn(6, 3)).argmax(1)


def _learner(batch_size, cbs, n=64):
    torch.manual_seed(1)
    dl = DataLoader(TensorDataset(X[:n], Y[:n]), batch_size=batch_size)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    opt_func = torch.optim.SGD
    return hs.Learner(
        model, (dl, None), nn.CrossEntropyLoss(), opt_func=opt_func, lr=0.1, cbs=cbs, progress=False
    )


class GradsAtStep(hs.Callback):
    """Copies every parameter's gradient when the optimizer is about to step."""

    order = 1000

    def __init__(self):
        self.steps = []

    def before_step(self):
        self.steps.append([p.grad.detach().clone() for p in self.learn.model.parameters()])


def _assert_same_grads(got, expected, rtol, atol):
    assert len(got) == len(expected)
    for step_got, step_expected in zip(got, expected, strict=True):
        for g, e in zip(step_got, step_expected, strict=True):
            torch.testing.assert_close(g, e, rtol=rtol, atol=atol)


def test_accumulating_4_batches_of_8_gives_the_gradients_of_batches_of_32():
    small, big = GradsAtStep(), GradsAtStep()
    accumulated = _learner(8, [GradientAccumulation(4), small])
    reference = _learner(32, [big])
    accumulated.fit(2)
    reference.fit(2)

    assert accumulated.training_step == reference.training_step == 4
    _assert_same_grads(small.steps, big.steps, rtol=1e-5, atol=1e-7)
    for p, q in zip(accumulated.model.parameters(), reference.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_the_recorder_logs_the_true_per_batch_loss():
    learn = _learner(8, [GradientAccumulation(4)])
    with torch.no_grad():
        first_four = [
            float(learn.loss_func(learn.model(X[i : i + 8]), Y[i : i + 8])) for i in range(0, 32, 8)
        ]
    learn.fit(1)
    # The weights only change after the 4th batch, so the first four losses are the initial model's.
    assert learn.recorder.losses[:4] == pytest.approx(first_four, rel=1e-6)


def test_a_short_last_group_steps_at_the_end_of_the_epoch_with_its_own_mean():
    # 48 samples in batches of 8: 6 batches, groups of 4 then 2.
    small, big = GradsAtStep(), GradsAtStep()
    accumulated = _learner(8, [GradientAccumulation(4), small], n=48)
    accumulated.fit(1)
    assert accumulated.training_step == 2

    reference = _learner(32, [big], n=48)  # batches of 32 then 16: the same two groups
    reference.fit(1)
    _assert_same_grads(small.steps, big.steps, rtol=1e-5, atol=1e-7)


def test_accumulation_works_with_mixed_precision():
    small, big = GradsAtStep(), GradsAtStep()
    accumulated = _learner(8, [GradientAccumulation(4), MixedPrecision(torch.float16), small])
    reference = _learner(32, [MixedPrecision(torch.float16), big])
    accumulated.fit(1)
    reference.fit(1)

    assert accumulated.mixed_precision.skipped_steps == 0
    assert accumulated.training_step == 2
    _assert_same_grads(small.steps, big.steps, rtol=2e-2, atol=2e-3)


def test_accumulation_rejects_a_non_positive_count():
    with pytest.raises(ValueError, match="n_batches=0"):
        GradientAccumulation(0)
