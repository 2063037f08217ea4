"""Where and with what the summarised forward runs: the device, and the arguments built from
``example_input``, keyword inputs or random tensors of ``input_size``, moved to that device."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from hookscope.hooks.tensors import map_tensors, model_device, tensors_in


def resolve_devices(model: nn.Module, device: torch.device | str | None) -> tuple[torch.device, torch.device]:
    """(the model's device, the device the forward runs on), which defaults to the model's.

    Any other device than the model's is refused, except ``meta``: running there computes nothing, so the
    model need not move.
    """
    model_on = model_device(model)
    run_device = torch.device(device) if device is not None else model_on
    if run_device.type in ("meta", model_on.type):
        return model_on, run_device
    raise ValueError(
        f"hs.summary: the model is on {model_on} but device={run_device}; move the model first "
        f"(model.to('{run_device}')), leave device=None, or use device='meta' to compute nothing"
    )


def cuda_indices(device: torch.device) -> list[int]:
    """The CUDA devices whose RNG a forward on ``device`` draws from, for ``torch.random.fork_rng``."""
    if device.type != "cuda":
        return []
    return [device.index if device.index is not None else torch.cuda.current_device()]


def prepare_inputs(
    model: nn.Module,
    example_input: Any,
    input_size: Sequence[int] | Sequence[Sequence[int]] | None,
    dtypes: Sequence[torch.dtype] | None,
    kwargs: dict[str, Any],
    device: torch.device,
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The forward's ``(args, kwargs)`` on ``device``: a tuple ``example_input`` is spread as arguments,
    anything else is one argument; ``input_size`` draws random tensors (zeros for integer ``dtypes``)."""
    if example_input is not None and input_size is not None:
        raise ValueError("hs.summary: pass example_input or input_size, not both")
    if dtypes is not None and input_size is None:
        raise ValueError("hs.summary: dtypes go with input_size; an example_input keeps its own dtypes")
    if input_size is not None:
        return _random_inputs(model, input_size, dtypes, device), _to_device(kwargs, device)
    if example_input is None and not kwargs:
        raise ValueError(
            "hs.summary needs an input: pass example_input=<tensor, tuple or dict>, "
            "input_size=(1, 3, 224, 224), or keyword inputs"
        )
    if example_input is None:
        args: tuple[Any, ...] = ()
    elif type(example_input) is tuple:
        args = example_input
    else:
        args = (example_input,)
    return _to_device(args, device), _to_device(kwargs, device)


def _random_inputs(
    model: nn.Module,
    input_size: Sequence[int] | Sequence[Sequence[int]],
    dtypes: Sequence[torch.dtype] | None,
    device: torch.device,
) -> tuple[torch.Tensor, ...]:
    shapes = _shapes(input_size)
    dtypes = list(dtypes) if dtypes is not None else [_float_dtype(model)] * len(shapes)
    if len(dtypes) != len(shapes):
        raise ValueError(
            f"hs.summary: {len(shapes)} input shapes but {len(dtypes)} dtypes; give one dtype per input"
        )
    return tuple(
        torch.randn(shape, dtype=dtype, device=device)
        if dtype.is_floating_point or dtype.is_complex
        else torch.zeros(shape, dtype=dtype, device=device)
        for shape, dtype in zip(shapes, dtypes, strict=True)
    )


def _shapes(input_size: Any) -> list[tuple[int, ...]]:
    """The input shapes ``input_size`` gives: one tuple/list of ints, or a tuple/list of them.

    Anything else (a dict, a bare int, floats) is refused: iterating it would quietly read a wrong shape.
    """
    if _is_shape(input_size):
        return [tuple(input_size)]
    if isinstance(input_size, (tuple, list)) and input_size and all(_is_shape(s) for s in input_size):
        return [tuple(s) for s in input_size]
    raise TypeError(
        f"hs.summary: input_size={input_size!r} is not a shape; pass a tuple/list of ints such as "
        "(1, 3, 224, 224), or a list of such tuples for several inputs, e.g. [(2, 5), (2, 8)]"
    )


def _is_shape(value: Any) -> bool:
    """A tuple/list (``torch.Size`` included) of non-negative ints; bools are not sizes."""
    return isinstance(value, (tuple, list)) and all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in value
    )


def _float_dtype(model: nn.Module) -> torch.dtype:
    floating = (p.dtype for p in model.parameters() if p.dtype.is_floating_point)
    return next(floating, torch.float32)


def _to_device(obj: Any, device: torch.device) -> Any:
    """``obj`` with its tensors on ``device``; returned as it is when they already are there, so custom
    containers (a tokenizer's batch, a dataclass-like mapping) reach ``forward`` untouched."""
    if all(t.device == device for t in tensors_in(obj)):
        return obj
    return map_tensors(lambda t: t.to(device), obj)
