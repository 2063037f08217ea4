"""Metrics for the Learner: any ``fn(pred, target) -> tensor``, or a torchmetrics-style ``Metric`` object.

A function metric is evaluated on each validation batch and averaged weighted by batch size, on the device.
An object with ``update`` / ``compute`` / ``reset`` (torchmetrics ``Metric``) keeps its own state instead.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import torch


def accuracy(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Fraction of samples whose arg-max class (over dim 1) equals the integer target."""
    if pred.ndim != target.ndim + 1:
        raise ValueError(
            f"accuracy: pred {tuple(pred.shape)} must have one more dim (the classes, dim 1) than "
            f"target {tuple(target.shape)}; pass class scores and integer labels"
        )
    return (pred.argmax(dim=1) == target).float().mean()


def error_rate(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``1 - accuracy``: the fraction of misclassified samples."""
    return 1 - accuracy(pred, target)


def is_stateful(metric: Any) -> bool:
    """True for objects that accumulate their own state (torchmetrics ``Metric`` and alike)."""
    return all(callable(getattr(metric, attr, None)) for attr in ("update", "compute", "reset"))


def metric_name(metric: Any) -> str:
    """The history key of a metric: its ``name`` attribute, function name, or snake-cased class name."""
    explicit = getattr(metric, "name", None)
    if isinstance(explicit, str):
        return explicit
    if isinstance(metric, functools.partial):
        return metric_name(metric.func)
    function_name = getattr(metric, "__name__", None)
    if isinstance(function_name, str):
        return function_name
    return re.sub(r"(?<!^)(?=[A-Z])", "_", type(metric).__name__).lower()
