"""Why the forward failed, in a note on the error: the failing module, the shapes it got, what it expects.

The error keeps its type and traceback; the note names the module and the shapes that led to it, and the
table up to the failure rides along as ``exc.summary``, so nothing has to be rerun to see where it broke.
"""

from __future__ import annotations

from contextlib import suppress

from torch import nn

from hookscope.hooks.summary.render import format_shapes
from hookscope.hooks.summary.result import Shape, Summary
from hookscope.hooks.summary.trace import Tracer

_CONV_TYPES = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
_CHANNEL_TYPES = (
    nn.BatchNorm1d,
    nn.BatchNorm2d,
    nn.BatchNorm3d,
    nn.SyncBatchNorm,
    nn.InstanceNorm1d,
    nn.InstanceNorm2d,
    nn.InstanceNorm3d,
)


def explain_failure(exc: BaseException, tracer: Tracer, partial: Summary) -> None:
    """Add to ``exc`` the note naming the failing module, its input shapes and what it expects, and attach
    ``partial`` (the table up to the failure) as ``exc.summary``."""
    _add_note(exc, _failure_note(tracer, partial))
    with suppress(AttributeError):  # an exception type with __slots__ cannot carry it
        exc.summary = partial  # type: ignore[attr-defined]


def _add_note(exc: BaseException, note: str) -> None:
    """Append ``note`` to the error without changing its type or traceback."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
        return
    # Python 3.10 has no add_note: extend the message itself, which keeps the type as well.
    first = f"{exc.args[0]}\n{note}" if exc.args and isinstance(exc.args[0], str) else note
    exc.args = (first, *exc.args[1:])


def _failure_note(tracer: Tracer, partial: Summary) -> str:
    where = f"the forward of {partial.model_type}"
    if tracer.failed is None:
        return f"hookscope.summary: {where} failed before any module ran"
    call = tracer.calls[tracer.failed]
    row = call.row
    if row.name:
        where = f"module '{row.name}' ({row.type})"
    received = format_shapes(row.input_shapes) or "no tensors"
    expectation = _expectation(call.module, row.input_shapes)
    return (
        f"hookscope.summary: the forward failed in {where}, which received {received}; {expectation}\n"
        f"shapes that led there: {_chain(tracer, tracer.failed)}; "
        f"the partial table ({len(partial.rows)} module calls) is attached: print(exc.summary)"
    )


def _chain(tracer: Tracer, failed: int) -> str:
    """Output shapes of the last leaf modules that completed (all before the failure), oldest first."""
    done = [
        c.row
        for c in tracer.calls
        if c.completed and next(c.module.children(), None) is None and c.row.output_shapes
    ]
    steps = [f"{row.name} {format_shapes(row.output_shapes)}" for row in done[-6:]]
    start = [f"input {format_shapes(tracer.calls[0].row.input_shapes)}"]
    skipped = ["…"] if len(done) > 6 else []
    return " -> ".join([*start, *skipped, *steps, f"{tracer.calls[failed].row.name or '(model)'} ✗"])


def _expectation(module: nn.Module, shapes: list[Shape]) -> str:
    """What the failing module expects, compared with the first input shape it got, for common layers."""
    described = f"it is {type(module).__name__}({module.extra_repr()})"
    if next(module.children(), None) is not None:
        described = f"the failing op is in {type(module).__name__}.forward itself, not in a submodule"
    if not shapes:
        return described
    got = shapes[0]
    if isinstance(module, nn.Linear) and got and got[-1] != module.in_features:
        return _mismatch(module, "in_features", module.in_features, f"last dimension {got[-1]}", got[-1])
    if isinstance(module, nn.RNNBase) and got and got[-1] != module.input_size:
        return _mismatch(module, "input_size", module.input_size, f"last dimension {got[-1]}", got[-1])
    if isinstance(module, nn.MultiheadAttention) and got and got[-1] != module.embed_dim:
        return _mismatch(module, "embed_dim", module.embed_dim, f"last dimension {got[-1]}", got[-1])
    if isinstance(module, nn.LayerNorm):
        expected = tuple(module.normalized_shape)
        if got[-len(expected) :] != expected:
            return (
                f"LayerNorm(normalized_shape={list(expected)}) got trailing dimensions "
                f"{list(got[-len(expected) :])}: make them match or change normalized_shape"
            )
    if isinstance(module, _CONV_TYPES):
        return _conv_expectation(module, got) or described
    if isinstance(module, _CHANNEL_TYPES) and len(got) > 1 and got[1] != module.num_features:
        return _mismatch(module, "num_features", module.num_features, f"{got[1]} channels (dim 1)", got[1])
    if isinstance(module, nn.Embedding):
        n = module.num_embeddings
        return f"Embedding(num_embeddings={n}) takes integer indices in [0, {n}); check the input's range"
    if isinstance(module, nn.GroupNorm) and len(got) > 1 and got[1] != module.num_channels:
        return _mismatch(module, "num_channels", module.num_channels, f"{got[1]} channels (dim 1)", got[1])
    return described


def _conv_expectation(module: nn.Module, got: Shape) -> str | None:
    spatial = len(module.kernel_size)
    kind = type(module).__name__
    dims = ", ".join("DHW"[3 - spatial :])
    if len(got) not in (spatial + 1, spatial + 2):
        return (
            f"{kind} expects a {spatial + 2}-d (N, C, {dims}) or {spatial + 1}-d input, got {len(got)}-d "
            f"{list(got)}: reshape the input"
        )
    channels = got[-(spatial + 1)]
    if channels != module.in_channels:
        return _mismatch(module, "in_channels", module.in_channels, f"{channels} channels", channels)
    return None


def _mismatch(module: nn.Module, attr: str, expected: int, got_text: str, got: int) -> str:
    kind = type(module).__name__
    return (
        f"{kind}({attr}={expected}) got {got_text}: make its input match {attr}={expected}, "
        f"or build it with {attr}={got}"
    )
