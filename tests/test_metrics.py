import functools

import pytest
import torch

import hookscope as hs
from hookscope.metrics import is_stateful, metric_name


def test_accuracy_counts_arg_max_matches():
    pred = torch.tensor([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4]])
    target = torch.tensor([1, 0, 0, 0])
    assert hs.metrics.accuracy(pred, target).item() == pytest.approx(0.75)
    assert hs.metrics.error_rate(pred, target).item() == pytest.approx(0.25)


def test_accuracy_uses_the_class_dim_for_dense_predictions():
    pred = torch.zeros(2, 3, 4, 4)
    pred[:, 2] = 1
    assert hs.metrics.accuracy(pred, torch.full((2, 4, 4), 2)).item() == 1.0


def test_accuracy_refuses_mismatched_shapes_with_a_clear_message():
    with pytest.raises(ValueError, match=r"pred \(4,\) must have one more dim"):
        hs.metrics.accuracy(torch.zeros(4), torch.zeros(4))


def test_metric_names():
    class MeanAbsoluteError:
        def update(self, pred, target): ...
        def compute(self): ...
        def reset(self): ...

    named = MeanAbsoluteError()
    assert metric_name(hs.metrics.accuracy) == "accuracy"
    assert metric_name(functools.partial(hs.metrics.accuracy)) == "accuracy"
    assert metric_name(MeanAbsoluteError()) == "mean_absolute_error"
    named.name = "mae"
    assert metric_name(named) == "mae"
    assert is_stateful(named) and not is_stateful(hs.metrics.accuracy)
