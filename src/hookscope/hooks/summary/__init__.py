"""summary(): the shapes, parameters and MACs of every module call in one forward, and shape errors explained.

One module per job:

- ``inputs``: the device and the forward's arguments, from ``example_input`` or ``input_size``;
- ``trace``: the hooked forward, recording every module call (``flops`` counts the work each one does);
- ``aggregate``: rows cut at ``depth``, MACs and parameters per row, model totals;
- ``explain``: when the forward fails, the note naming the module and the shapes it received;
- ``result``: :class:`Summary` and :class:`SummaryRow`, what :func:`summary` returns;
- ``render``: the table laid out: printed (rich), plain text, HTML for a notebook.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from hookscope.hooks.summary.aggregate import build_summary
from hookscope.hooks.summary.explain import explain_failure
from hookscope.hooks.summary.inputs import cuda_indices, prepare_inputs, resolve_devices
from hookscope.hooks.summary.result import Summary, SummaryRow
from hookscope.hooks.summary.trace import Tracer

__all__ = ["Summary", "SummaryRow", "summary"]


def summary(
    model: nn.Module,
    example_input: Any = None,
    input_size: Sequence[int] | Sequence[Sequence[int]] | None = None,
    dtypes: Sequence[torch.dtype] | None = None,
    depth: int | None = None,
    device: torch.device | str | None = None,
    **kwargs: Any,
) -> Summary:
    """Run one forward of ``model`` and return a :class:`Summary` of every module call in it.

    Inputs: ``example_input`` (a tensor or dict is passed as one argument, a tuple is spread as arguments,
    extra ``kwargs`` go to ``forward`` as keywords), or ``input_size`` (one shape, batch included, or a list
    of shapes, with ``dtypes`` per input). ``depth`` folds deeper calls into their ancestor row. ``device``
    defaults to the model's; ``device="meta"`` summarises a real model without computing anything.
    The model's train/eval modes and the RNG state are restored, no gradient is computed and no hook is
    left behind. If the forward raises, the error keeps its type, gains a note naming the module, the
    shapes it received and what it expects, and carries the partial table as ``exc.summary``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"hs.summary needs an nn.Module, got {type(model).__name__}; pass the model itself")
    if depth is not None and depth < 0:
        raise ValueError(f"hs.summary: depth={depth} must be >= 0 (0 lists only the model itself)")
    model_device, run_device = resolve_devices(model, device)
    with torch.random.fork_rng(devices=cuda_indices(run_device)):
        args, kw = prepare_inputs(model, example_input, input_size, dtypes, kwargs, run_device)
        tracer = Tracer(model)
        try:
            tracer.run(args, kw, run_device, model_device)
        except Exception as exc:
            explain_failure(exc, tracer, build_summary(model, tracer, depth, args, kw, raised=True))
            raise
    return build_summary(model, tracer, depth, args, kw, raised=False)
