"""What a batch holds, read one way for the whole package: the inputs and the targets, and the positional
and keyword arguments a model is called with.

fastai's rule: the last item of a tuple or list batch is the target, the items before it the model's
inputs; a one-item batch, a lone tensor and a dict are inputs without a target. The Learner, preflight,
``ablate``, ``prune`` and ``find_nonfinite`` all read batches through :func:`split_batch`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def split_batch(batch: Any) -> tuple[tuple, tuple]:
    """``(inputs, targets)``, both tuples: ``(x, y)`` gives ``((x,), (y,))``, ``(x1, x2, y)`` gives
    ``((x1, x2), (y,))``; ``(x,)``, a lone tensor and a dict (one input, passed whole) give no target."""
    if not isinstance(batch, tuple | list):
        return (batch,), ()
    items = tuple(batch)
    if len(items) <= 1:
        return items, ()
    return items[:-1], items[-1:]


def split_inputs(inputs: Any) -> tuple[tuple, dict]:
    """The ``(args, kwargs)`` a model is called with: a dict gives keyword arguments, a tuple or list
    positional ones, anything else (a tensor) is the one positional argument."""
    if isinstance(inputs, Mapping):
        return (), dict(inputs)
    if isinstance(inputs, tuple | list):
        return tuple(inputs), {}
    return (inputs,), {}
