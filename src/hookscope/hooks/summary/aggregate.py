"""Traced calls to a :class:`~hookscope.hooks.summary.result.Summary`: rows cut at ``depth``, then MACs,
parameters and model totals.

Parameters are counted once, by the nearest listed module that holds them, so tied weights and parameters
held directly by a container are neither lost nor doubled. A call deeper than ``depth`` adds its MACs to its
nearest listed ancestor, so the total stays the same at every depth.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.nn.parameter import is_lazy

from hookscope.hooks.summary.result import Summary
from hookscope.hooks.summary.trace import Call, Tracer, nbytes


def build_summary(
    model: nn.Module, tracer: Tracer, depth: int | None, args: Any, kwargs: Any, raised: bool
) -> Summary:
    """The :class:`Summary` of what ``tracer`` recorded; ``raised`` says the forward failed, so the failing
    module is named and the table holds the calls up to the failure."""
    kept = [i for i, call in enumerate(tracer.calls) if depth is None or call.row.depth <= depth]
    macs = _fold_macs(tracer.calls, set(kept))
    rows = [tracer.calls[i].row for i in kept]
    params = _param_owners(model, {row.name for row in rows})
    for i, row in zip(kept, rows, strict=True):
        row.macs = macs[i] // 2
        if row.call == 0:
            row.params, row.trainable_params = params.get(row.name, (0, 0))
    unique_params = [p for p in model.parameters() if not is_lazy(p)]
    unique_buffers = [b for b in model.buffers() if not is_lazy(b)]
    failed = tracer.calls[tracer.failed].row.name if raised and tracer.failed is not None else None
    return Summary(
        model_type=type(model).__name__,
        rows=rows,
        total_params=sum(p.numel() for p in unique_params),
        trainable_params=sum(p.numel() for p in unique_params if p.requires_grad),
        total_macs=sum(row.macs for row in rows),
        param_bytes=sum(p.numel() * p.element_size() for p in unique_params),
        buffer_elements=sum(b.numel() for b in unique_buffers),
        buffer_bytes=sum(b.numel() * b.element_size() for b in unique_buffers),
        input_bytes=nbytes((args, kwargs)),
        activation_bytes=sum(c.output_bytes for c in tracer.calls),
        failed_module=failed,
        notes=[*tracer.notes, *_lazy_notes(model)],
    )


def _fold_macs(calls: list[Call], kept: set[int]) -> dict[int, int]:
    """Own FLOPs per kept call; a call deeper than ``depth`` adds its FLOPs to its nearest kept ancestor."""
    flops = dict.fromkeys(kept, 0)
    for i, call in enumerate(calls):
        owner: int | None = i
        while owner is not None and owner not in kept:
            owner = calls[owner].parent
        if owner is not None:
            flops[owner] += call.own_flops
    return flops


def _param_owners(model: nn.Module, listed: set[str]) -> dict[str, tuple[int, int]]:
    """(params, trainable) per listed module name: each unique parameter goes to its nearest listed holder."""
    counts: dict[str, tuple[int, int]] = {}
    for name, p in model.named_parameters():
        if is_lazy(p):
            continue
        owner = name.rpartition(".")[0]
        while owner and owner not in listed:
            owner = owner.rpartition(".")[0]
        total, trainable = counts.get(owner, (0, 0))
        counts[owner] = (total + p.numel(), trainable + (p.numel() if p.requires_grad else 0))
    return counts


def _lazy_notes(model: nn.Module) -> list[str]:
    """A note naming the parameters and buffers still uninitialised after the forward (their module never
    ran): they have no size yet, so the totals leave them out."""
    lazy = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if is_lazy(t)]
    if not lazy:
        return []
    shown = ", ".join(lazy[:5]) + (f", … (+{len(lazy) - 5})" if len(lazy) > 5 else "")
    return [
        f"{len(lazy)} lazy parameters/buffers are still uninitialised after the forward (their module did "
        f"not run) and are not counted: {shown}"
    ]
