"""The tensors inside nested values, the device of a model, and per-tensor norms: one copy of each.

Hooks see whatever a module takes and returns: a tensor, a tuple of them (LSTM: ``(out, (h, c))``), a
dict, a named tuple, a dataclass such as a Hugging Face ``ModelOutput``. Every feature that looks for
tensors walks those values with the same rule, defined here:

- a tensor (``nn.Parameter`` included) is a leaf;
- a mapping is walked through its values, in its own order (``dict``, ``OrderedDict``, ``defaultdict``,
  ``ModelOutput``, any ``collections.abc.Mapping``);
- a tuple or a list (named tuples, ``torch.return_types`` and other subclasses included) through its items;
- a dataclass instance through its fields, in declaration order;
- anything else (strings, numbers, None, arbitrary objects) holds no tensor, and is kept as it is.

Order is depth-first, left to right: the order in which the values appear when the structure is written out.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from typing import Any

import torch
from torch import nn

from hookscope import compat


def tensors_in(obj: Any) -> list[torch.Tensor]:
    """Every tensor inside ``obj`` (see the module docstring for what is walked), depth-first, in order."""
    if isinstance(obj, torch.Tensor):  # the common case, per hook call: no generator
        return [obj]
    return list(_walk(obj))


def first_tensor(obj: Any) -> torch.Tensor | None:
    """The first tensor of :func:`tensors_in` (an LSTM's ``(out, (h, c))`` gives ``out``), or None.

    Stops at the first tensor found, so a large output structure costs no more than its first branch.
    """
    if isinstance(obj, torch.Tensor):
        return obj
    return next(_walk(obj), None)


def map_tensors(fn: Callable[[torch.Tensor], Any], obj: Any) -> Any:
    """``obj`` with every tensor replaced by ``fn(tensor)``, rebuilt with the same structure and types.

    Tuples, lists and named tuples are rebuilt with their own type; a plain ``dict`` as a ``dict``; other
    mutable mappings (``OrderedDict``, ``defaultdict``, ``ModelOutput``) and dataclass instances are
    shallow-copied and their tensor entries replaced, so their type, extra state and ``__init__``
    arguments survive (a frozen dataclass too); an immutable mapping becomes a ``dict``. Non-tensors are
    kept as they are (the same objects).
    """
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, Mapping):
        if type(obj) is dict:
            return {key: map_tensors(fn, value) for key, value in obj.items()}
        if isinstance(obj, MutableMapping):
            mapped = copy.copy(obj)
            for key, value in obj.items():
                mapped[key] = map_tensors(fn, value)
            return mapped
        return {key: map_tensors(fn, value) for key, value in obj.items()}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a named tuple takes its fields as arguments
        return type(obj)(*(map_tensors(fn, value) for value in obj))
    if isinstance(obj, list | tuple):
        return type(obj)(map_tensors(fn, value) for value in obj)
    if _is_dataclass_instance(obj):
        mapped = copy.copy(obj)
        for field in dataclasses.fields(obj):
            if hasattr(obj, field.name):  # an ``init=False`` field may never have been set
                # object.__setattr__: a frozen dataclass refuses setattr, and __init__ is not run again
                object.__setattr__(mapped, field.name, map_tensors(fn, getattr(obj, field.name)))
        return mapped
    return obj


def model_device(model: nn.Module) -> torch.device:
    """Where ``model`` lives: the device of its first parameter, else of its first buffer, else the CPU.

    A buffer-only model (a normaliser, a frozen lookup table) still has a device; a model with neither
    parameters nor buffers computes wherever its inputs are, and the CPU is the neutral answer.
    """
    for tensor in model.parameters():
        return tensor.device
    for tensor in model.buffers():
        return tensor.device
    return torch.device("cpu")


def grad_norms(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The L2 norm of each tensor, as one float32 vector on their device (one fused op, no host sync).

    Pass gradients (``[p.grad for p in params if p.grad is not None]``). An empty list gives an empty
    float32 vector on the CPU. Tensors of several dtypes are fine (the norms are converted to float32, so a
    float64 norm above 3.4e38 reads as inf); all tensors must be on one device.
    """
    if not tensors:
        return torch.zeros(0, dtype=torch.float32)
    return torch.stack(compat.foreach_norm(tensors)).to(torch.float32)


def _walk(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, Mapping):
        for value in obj.values():
            yield from _walk(value)
    elif isinstance(obj, list | tuple):
        for value in obj:
            yield from _walk(value)
    elif _is_dataclass_instance(obj):
        for field in dataclasses.fields(obj):
            yield from _walk(getattr(obj, field.name, None))


def _is_dataclass_instance(obj: Any) -> bool:
    return dataclasses.is_dataclass(obj) and not isinstance(obj, type)
