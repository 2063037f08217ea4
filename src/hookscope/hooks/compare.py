"""compare(): run two models on the same inputs and name the first module where they part, and the op.

The questions it answers: "my port of this model gives different outputs — from which layer on?", "did the
refactor change what ``layer4`` computes?", "why do the gradients differ when the outputs agree?".

Both models run from the same RNG state (same dropout masks) with their buffers restored afterwards;
:func:`~hookscope.capture` records every module's output (and, with a loss, the gradients of each module's
output and inputs), and every parameter's gradient comes from ``torch.autograd.grad`` (``.grad`` is left
alone). Modules are matched by qualified name, through ``names=`` where the port renamed them.

*First* means the origin, not the first row that differs: a difference propagates to every later layer, so

- **forward**: the first module, in the order outputs are produced, whose output is beyond tolerance — its
  inputs came from modules that finished earlier and matched. When its input already differs, the code
  around it made the difference (``x * 2`` between two submodules): its parent module is named instead;
- **backward** (only when every output and the loss match): walking the modules in the order the backward
  reaches them, the first whose gradient w.r.t. its output still matches but whose gradients w.r.t. its
  inputs or its own parameters do not — its own backward made the difference.

For that module, the op where it starts is searched as :func:`~hookscope.find_nonfinite` does: the module of
each model is replayed alone on the *same* input (model_a's) under an op trace (forward: each aten op's
output; backward: each autograd node's gradient), and the first op whose results differ is named.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from hookscope import compat
from hookscope.hooks.batch import split_inputs
from hookscope.hooks.capture import Capture, capture
from hookscope.hooks.ops import float_tensors, op_name
from hookscope.hooks.rng import restore_torch_rng, torch_rng
from hookscope.hooks.tensors import map_tensors, tensors_in

OUTPUT = "<output>"  # the row of the model's own output (code in its forward after the last module)
LOSS = "<loss>"


@dataclass(frozen=True)
class LayerDiff:
    """One module (one call of it) in both models: the largest differences and whether they are beyond
    tolerance. ``max_abs`` is ``max |a - b|``; ``max_rel`` is ``max_abs / max |a|`` (relative to the scale
    of model_a's values, so that values near zero do not blow it up). ``grad_*`` compare the gradient of
    the loss w.r.t. the module's output, ``param_grad_*`` w.r.t. the module's own parameters (None: not
    computed). ``note`` says what could not be compared (shapes that differ, a gradient in one model only).
    """

    name: str
    name_b: str
    module_type: str
    call: int
    shape_a: tuple[int, ...] | None
    shape_b: tuple[int, ...] | None
    max_abs: float | None
    max_rel: float | None
    beyond: bool
    grad_max_abs: float | None = None
    grad_max_rel: float | None = None
    param_grad_max_abs: float | None = None
    param_grad_max_rel: float | None = None
    grad_beyond: bool = False
    note: str = ""


@dataclass(frozen=True, repr=False)
class Comparison:
    """What :func:`compare` found: one :class:`LayerDiff` per module call in execution order, the
    ``first_divergent`` module (None: the models agree within tolerance), the ``phase`` where they part
    (``"forward"`` or ``"backward"``), the ``op`` where it starts when the replay could name it (an aten op
    or an autograd node; ``"a / b"`` when the models run different ops there), and the modules that exist
    in one model only."""

    layers: list[LayerDiff]
    first_divergent: str | None
    phase: str | None
    op: str | None
    rtol: float
    atol: float
    only_in_a: list[str] = field(default_factory=list)
    only_in_b: list[str] = field(default_factory=list)
    reason: str = ""  # why the first divergent module is the origin, in words
    op_where: str = ""  # where ``op`` sits in the module, in words
    first_call: int = 0  # which call of the first divergent module (one that runs several times)

    @property
    def identical(self) -> bool:
        """Every compared value is within tolerance and both models have the same modules."""
        return self.first_divergent is None and not self.only_in_a and not self.only_in_b

    def layer(self, name: str) -> LayerDiff:
        """The row of module ``name`` (model_a's name; its last call)."""
        rows = [row for row in self.layers if row.name == name]
        if not rows:
            raise KeyError(f"compare: no module {name!r} was compared; compared: {_head(self.names)}")
        return rows[-1]

    @property
    def names(self) -> list[str]:
        """The compared modules (model_a's names), in execution order."""
        return list(dict.fromkeys(row.name for row in self.layers))

    def to_dict(self) -> dict[str, Any]:
        """Plain containers, ready for JSON."""
        return asdict(self)

    def paragraph(self) -> str:
        """The finding in one paragraph of plain words."""
        tolerance = f"rtol={self.rtol:g}, atol={self.atol:g}"
        extra = _only_in(self.only_in_a, "model_a") + _only_in(self.only_in_b, "model_b")
        if self.first_divergent is None:
            return (
                f"The two models agree: every one of the {len(self.layers)} compared values is within "
                f"tolerance ({tolerance}).{extra}"
            )
        row = next(row for row in self.layers if self._is_first(row))
        renamed = f"; `{row.name_b}` in model_b" if row.name_b != row.name else ""
        where = f"`{row.name}` ({row.module_type}{renamed})"
        op = f" The difference starts at {self.op_where}." if self.op else ""
        if self.phase == "backward":
            return (
                f"The forward passes agree within {tolerance}, but the backward passes part at {where}: the "
                f"gradient w.r.t. its output still matches, and {self.reason}.{op}{extra}"
            )
        others = sum(r.beyond for r in self.layers) - 1
        plural = "s follow" if others != 1 else " follows"
        follow = f" The {others} other difference{plural} from it." if others else ""
        return f"The models part in the forward pass at {where}: {self.reason}.{follow}{op}{extra}"

    def table(self) -> str:
        """One row per compared module call: differences of outputs and gradients, '!' beyond tolerance."""
        header = ("module", "type", "shape", "max abs", "max rel", "grad abs", "param grad abs", "")
        rows = [header] + [_row_cells(row, self._is_first(row)) for row in self.layers]
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths).rstrip())
        return "\n".join(lines)

    def __str__(self) -> str:
        return f"{self.paragraph()}\n\n{self.table()}"

    def _is_first(self, row: LayerDiff) -> bool:
        return row.name == self.first_divergent and row.call == self.first_call

    def __repr__(self) -> str:
        return (
            f"Comparison(first_divergent={self.first_divergent!r}, phase={self.phase!r}, op={self.op!r}, "
            f"{len(self.layers)} module calls)"
        )

    def _repr_html_(self) -> str:
        head = "".join(
            f"<th>{html.escape(h)}</th>"
            for h in ("module", "type", "shape", "max abs", "max rel", "grad abs", "param grad abs", "")
        )
        body = "".join(
            f'<tr style="{_html_style(row, self._is_first(row))}">'
            + "".join(f"<td>{html.escape(c)}</td>" for c in _row_cells(row, self._is_first(row)))
            + "</tr>"
            for row in self.layers
        )
        return (
            f"<div><p>{html.escape(self.paragraph())}</p>"
            f'<table style="font-family:monospace;font-size:12px"><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>"
        )


def compare(
    model_a: nn.Module,
    model_b: nn.Module,
    *inputs: Any,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    names: Mapping[str, str] | None = None,
    loss_func: Callable[..., torch.Tensor] | None = None,
    target: Any = None,
) -> Comparison:
    """Run ``model_a`` and ``model_b`` on the same ``inputs`` and compare every module, in execution order.

    ``inputs`` are the positional arguments of the forward (a single dict is passed as keyword arguments).
    A value is *beyond tolerance* when ``torch.allclose(b, a, rtol, atol)`` is False. ``names`` maps
    model_a's module names to model_b's for a port that renamed them (unlisted names are looked up as they
    are). With ``loss_func`` (and ``target``, passed after the prediction: ``loss_func(pred, *target)``) the
    same backward runs in both and gradients are compared too. Both models run in their current mode
    (train/eval); buffers, ``.grad`` and hooks are left as they were. See the module docstring for what
    ``first_divergent`` means.
    """
    model_a, model_b = compat.uncompiled(model_a), compat.uncompiled(model_b)
    args, kwargs = split_inputs(inputs[0] if len(inputs) == 1 and isinstance(inputs[0], Mapping) else inputs)
    targets = target if isinstance(target, tuple | list) else () if target is None else (target,)
    mapping = dict(names or {})
    _check_names(model_a, model_b, mapping)
    rng = torch_rng()
    run_a = _run(model_a, args, kwargs, loss_func, targets, rng)
    run_b = _run(model_b, args, kwargs, loss_func, targets, rng)
    restore_torch_rng(rng)
    layers = _layer_diffs(run_a, run_b, model_a, model_b, mapping, rtol, atol)
    names_a, names_b = _module_names(model_a), _module_names(model_b)
    matched = {mapping.get(name, name) for name in names_a}
    only_a = [name for name in names_a if mapping.get(name, name) not in set(names_b)]
    only_b = [name for name in names_b if name not in matched]
    first, reason = _first_forward(layers, rtol, atol)
    if first is not None and not first.note:
        first, reason = _made_by_parent(first, reason, layers, run_a, run_b, rtol, atol)
    phase = "forward" if first is not None else None
    if first is None and loss_func is not None:
        first, reason = _first_backward(layers, run_a, run_b, rtol, atol)
        phase = "backward" if first is not None else None
    if first is None:
        return Comparison(layers, None, None, None, rtol, atol, only_a, only_b)
    found = None
    if first.name != LOSS and not first.note:
        found = _blame_op(model_a, model_b, run_a, first, phase, rng, rtol, atol)
    op, where = found if found else (None, "")
    return Comparison(layers, first.name, phase, op, rtol, atol, only_a, only_b, reason, where, first.call)


# ------------------------------------------------------------------------------------------- one model


@dataclass
class _Run:
    """What one model did: records keyed by (module, call, kind), its modules' types and parameter grads."""

    values: dict[tuple[str, int, str], Any]
    order: list[tuple[str, int]]  # module calls in the order their outputs were produced
    backward_order: list[tuple[str, int]]  # module calls in the order the backward reached their output
    types: dict[str, str]
    param_grads: dict[str, torch.Tensor | None]


def _run(
    model: nn.Module, args: tuple, kwargs: dict, loss_func: Callable | None, targets: tuple, rng: Any
) -> _Run:
    kinds = ("input", "output", "grad_output", "grad_input") if loss_func is not None else ("input", "output")
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    grad_mode = torch.enable_grad() if loss_func is not None else torch.no_grad()
    with _buffers_kept(model), grad_mode:
        restore_torch_rng(rng)
        with capture(model, lambda name, module: True, what=kinds) as cap:
            pred = model(*args, **kwargs)
            loss = loss_func(pred, *targets) if loss_func is not None else None
            grads: list[Any] = [None] * len(params)
            if loss is not None and loss.requires_grad and params:
                grads = list(torch.autograd.grad(loss.sum(), [p for _, p in params], allow_unused=True))
    values, order, backward = _indexed(cap)
    values[(OUTPUT, 0, "input")] = (*args, kwargs) if kwargs else args
    values[(OUTPUT, 0, "output")] = _detached(pred)
    order.append((OUTPUT, 0))
    if loss is not None:
        values[(LOSS, 0, "output")] = loss.detach().clone()
        order.append((LOSS, 0))
    types = {name: type(m).__name__ for name, m in model.named_modules()}
    types[OUTPUT], types[LOSS] = type(model).__name__, type(loss_func).__name__
    grads_by_name = {name: g for (name, _), g in zip(params, grads, strict=True)}
    return _Run(values, order, backward, types, grads_by_name)


def _indexed(cap: Capture) -> tuple[dict, list, list]:
    values: dict[tuple[str, int, str], Any] = {}
    order: list[tuple[str, int]] = []
    backward: list[tuple[str, int]] = []
    for record in cap.records:
        values[(record.name, record.call, record.kind)] = record.value
        if record.kind == "output":
            order.append((record.name, record.call))
        if record.kind == "grad_output":
            backward.append((record.name, record.call))
    return values, order, backward


@contextmanager
def _buffers_kept(model: nn.Module) -> Iterator[None]:
    """Put the buffers (BatchNorm running statistics) back as they were when the block ends."""
    kept = {name: b.detach().clone() for name, b in model.named_buffers()}
    try:
        yield
    finally:
        with torch.no_grad():
            for name, buffer in model.named_buffers():
                if name in kept:
                    buffer.copy_(kept[name])


def _detached(value: Any) -> Any:
    return map_tensors(lambda t: t.detach().clone(), value)


# ------------------------------------------------------------------------------------------ comparing


@dataclass(frozen=True)
class _Diff:
    max_abs: float | None
    max_rel: float | None
    beyond: bool
    note: str = ""


def _diff(a: Any, b: Any, rtol: float, atol: float) -> _Diff:
    """Largest differences between two captured values (tensors or structures of them)."""
    ta, tb = _tensors(a), _tensors(b)
    if not ta and not tb:
        return _Diff(None, None, False)
    if len(ta) != len(tb):
        return _Diff(None, None, True, f"model_a gives {len(ta)} tensors, model_b {len(tb)}")
    max_abs, scale, beyond = 0.0, 0.0, False
    for x, y in zip(ta, tb, strict=True):
        if x.shape != y.shape:
            return _Diff(None, None, True, f"shapes differ: {_shape(x)} in model_a, {_shape(y)} in model_b")
        x, y = x.double(), y.to(x.device).double()
        if x.numel() == 0:
            continue
        max_abs = max(max_abs, float((x - y).abs().nan_to_num(math.inf).max()))
        scale = max(scale, float(x.abs().max()))
        beyond = beyond or not torch.allclose(y, x, rtol=rtol, atol=atol, equal_nan=True)
    return _Diff(max_abs, max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else math.inf), beyond)


def _tensors(value: Any) -> list[torch.Tensor]:
    return [t for t in tensors_in(value) if t is not None]


def _layer_diffs(
    run_a: _Run, run_b: _Run, model_a: nn.Module, model_b: nn.Module, mapping: dict, rtol: float, atol: float
) -> list[LayerDiff]:
    rows = []
    for name, call in run_a.order:
        name_b = mapping.get(name, name)
        if (name_b, call, "output") not in run_b.values:
            continue
        a, b = run_a.values[(name, call, "output")], run_b.values[(name_b, call, "output")]
        out = _diff(a, b, rtol, atol)
        grad = _grad_diff(run_a, run_b, (name, call), (name_b, call), "grad_output", rtol, atol)
        params = _param_grad_diff(run_a, run_b, model_a, name, name_b, rtol, atol)
        rows.append(
            LayerDiff(
                name, name_b, run_a.types.get(name, ""), call, _first_shape(a), _first_shape(b),
                out.max_abs, out.max_rel, out.beyond, grad.max_abs, grad.max_rel, params.max_abs,
                params.max_rel, grad.beyond or params.beyond, out.note or grad.note or params.note,
            )
        )  # fmt: skip
    return rows


def _grad_diff(
    run_a: _Run,
    run_b: _Run,
    key_a: tuple[str, int],
    key_b: tuple[str, int],
    kind: str,
    rtol: float,
    atol: float,
) -> _Diff:
    """A gradient recorded in one model only is a difference (the path is cut in the other)."""
    a, b = run_a.values.get((*key_a, kind)), run_b.values.get((*key_b, kind))
    if a is None and b is None:
        return _Diff(None, None, False)
    if a is None or b is None:
        missing = "model_a" if a is None else "model_b"
        what = "its output" if kind == "grad_output" else "its input"
        return _Diff(None, None, True, f"no gradient reaches {what} in {missing}")
    return _diff(a, b, rtol, atol)


def _param_grad_diff(
    run_a: _Run, run_b: _Run, model_a: nn.Module, name: str, name_b: str, rtol: float, atol: float
) -> _Diff:
    """The gradients of the module's own parameters (not its children's), matched by name."""
    if name in (OUTPUT, LOSS):
        return _Diff(None, None, False)
    own = [n for n, _ in model_a.get_submodule(name).named_parameters(recurse=False)]
    pairs = [
        (run_a.param_grads.get(_join(name, n)), run_b.param_grads.get(_join(name_b, n)))
        for n in own
        if _join(name, n) in run_a.param_grads
    ]
    if not pairs or all(a is None and b is None for a, b in pairs):
        return _Diff(None, None, False)
    if any((a is None) != (b is None) for a, b in pairs):
        return _Diff(None, None, True, "its parameters get a gradient in one model only")
    return _diff([a for a, _ in pairs], [b for _, b in pairs], rtol, atol)


def _first_forward(layers: list[LayerDiff], rtol: float, atol: float) -> tuple[LayerDiff | None, str]:
    """The first module call whose output is beyond tolerance, and why it is the origin, in words."""
    first = next((row for row in layers if row.beyond), None)
    if first is None:
        return None, ""
    if first.note:
        return first, first.note
    reason = (
        f"every module before it matches within rtol={rtol:g}, atol={atol:g}, and its output differs by up "
        f"to {_num(first.max_abs)} ({_num(first.max_rel)} of its scale)"
    )
    return first, reason


def _made_by_parent(
    first: LayerDiff, reason: str, layers: list[LayerDiff], run_a: _Run, run_b: _Run, rtol: float, atol: float
) -> tuple[LayerDiff, str]:
    """When the first differing module already received a differing input, every module before it
    matched: the difference was made by its parent's own code (a ``x * 2`` between two submodules)."""
    key_b = (first.name_b, first.call, "input")
    received = _diff(run_a.values.get((first.name, first.call, "input")), run_b.values.get(key_b), rtol, atol)
    if not received.beyond:
        return first, reason
    parent = first.name.rpartition(".")[0] or OUTPUT
    after = layers[layers.index(first) :]
    enclosing = next((row for row in after if row.name == parent), None)
    if enclosing is None:
        return first, reason
    owner = "the model's own forward" if parent == OUTPUT else f"`{parent}`"
    return enclosing, (
        f"the input of `{first.name}` inside it already differs while every module before it matches, so "
        f"{owner} made the difference in its own code, between its submodules"
    )


def _first_backward(
    layers: list[LayerDiff], run_a: _Run, run_b: _Run, rtol: float, atol: float
) -> tuple[LayerDiff | None, str]:
    """Backward order: the first module whose output gradient matches but whose own backward does not (a
    container is passed over for the child inside it that made the difference)."""
    rows = {(row.name, row.call): row for row in layers}
    order = list(dict.fromkeys([*run_a.backward_order, *reversed(run_a.order)]))
    flagged = []
    for key in order:
        reason = _own_backward_differs(rows[key], run_a, run_b, rtol, atol) if key in rows else ""
        if reason:
            flagged.append((rows[key], reason))
    for row, reason in flagged:
        if not any(other.name.startswith(row.name + ".") for other, _ in flagged):
            return row, reason
    return None, ""


def _own_backward_differs(row: LayerDiff, run_a: _Run, run_b: _Run, rtol: float, atol: float) -> str:
    """Why the module's own backward differs (its output gradient matching), or "" when it does not."""
    if row.name in (OUTPUT, LOSS):
        return ""
    key_a, key_b = (row.name, row.call), (row.name_b, row.call)
    if _grad_diff(run_a, run_b, key_a, key_b, "grad_output", rtol, atol).beyond:
        return ""  # the difference reached it from later modules
    inputs = _grad_diff(run_a, run_b, key_a, key_b, "grad_input", rtol, atol)
    if inputs.note:
        return f"{inputs.note} (the gradient path is cut just before it: a detach, no_grad or integer op)"
    if inputs.beyond:
        return f"the gradient w.r.t. its input differs by up to {_num(inputs.max_abs)}"
    if row.grad_beyond:
        return row.note or f"its parameters' gradients differ by up to {_num(row.param_grad_max_abs)}"
    return ""


# ----------------------------------------------------------------------------------- the op where it starts


class _OpRecorder(compat.TorchDispatchMode):
    """Every aten op in order, with copies of its floating-point outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, list[torch.Tensor]]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.ops.append((op_name(func), [t.detach().clone() for t in float_tensors(out)]))
        return out


def _blame_op(
    model_a: nn.Module,
    model_b: nn.Module,
    run_a: _Run,
    row: LayerDiff,
    phase: str,
    rng: Any,
    rtol: float,
    atol: float,
) -> tuple[str, str] | None:
    """Replay the module of ``row`` in each model alone on model_a's input; the first op whose results
    differ."""
    captured = run_a.values.get((row.name, row.call, "input"))
    if captured is None:
        return None
    args, kwargs = _call_arguments(captured)
    modules = (_module(model_a, row.name), _module(model_b, row.name_b))
    try:
        if phase == "forward":
            traces = [_forward_ops(m, args, kwargs, rng) for m in modules]
        else:
            grad = run_a.values.get((row.name, row.call, "grad_output"))
            traces = [_backward_nodes(m, args, kwargs, grad, rng) for m in modules]
    except Exception:  # a module that cannot run alone (it needs its parent's state): no op to name
        return None
    return _first_op_apart(*traces, rtol=rtol, atol=atol)


def _call_arguments(captured: Any) -> tuple[tuple, dict]:
    """The ``(args, kwargs)`` back from what capture's ``"input"`` kept: one value, or the positional
    arguments with the keyword ones as a last dict."""
    if not isinstance(captured, tuple):
        return (captured,), {}
    if captured and isinstance(captured[-1], dict):
        return captured[:-1], captured[-1]
    return captured, {}


def _forward_ops(
    module: nn.Module, args: tuple, kwargs: dict, rng: Any
) -> list[tuple[str, list[torch.Tensor]]]:
    with _buffers_kept(module), torch.no_grad():
        restore_torch_rng(rng)
        with _OpRecorder() as trace:
            module(*args, **kwargs)
    return trace.ops


def _module(model: nn.Module, name: str) -> nn.Module:
    return model if name == OUTPUT else model.get_submodule(name)


def _backward_nodes(
    module: nn.Module, args: tuple, kwargs: dict, grad: Any, rng: Any
) -> list[tuple[str, list[torch.Tensor]]]:
    """Each autograd node the module's backward runs, in order, with the gradients it computed."""
    nodes: list[tuple[str, list[torch.Tensor]]] = []
    inputs = [_leaf(a) for a in args]
    with _buffers_kept(module):
        restore_torch_rng(rng)
        out = module(*inputs, **kwargs)
    outs = [t for t in tensors_in(out) if t.requires_grad]
    grads = [g for g in tensors_in(grad)] if grad is not None else []
    if not outs or len(grads) != len(outs):
        return nodes
    seen, pending, handles = set(), [t.grad_fn for t in outs if t.grad_fn is not None], []

    def hook(node: Any) -> Callable:
        def record(grad_inputs: tuple, grad_outputs: tuple) -> None:
            nodes.append((type(node).__name__, [g.detach().clone() for g in grad_inputs if g is not None]))

        return record

    while pending:
        node = pending.pop()
        if node in seen or type(node).__name__ == "AccumulateGrad":
            continue
        seen.add(node)
        handles.append(node.register_hook(hook(node)))
        pending.extend(child for child, _ in node.next_functions if child is not None)
    try:
        leaves = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
        leaves += [p for p in module.parameters() if p.requires_grad]
        torch.autograd.grad(outs, leaves, grads, allow_unused=True)
    finally:
        for handle in handles:
            handle.remove()
    return nodes


def _leaf(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and (value.is_floating_point() or value.is_complex()):
        return value.detach().clone().requires_grad_(True)
    return value


def _first_op_apart(
    ops_a: list[tuple[str, list[torch.Tensor]]],
    ops_b: list[tuple[str, list[torch.Tensor]]],
    rtol: float,
    atol: float,
) -> str | None:
    """The first op whose results differ: its name (``"a / b"`` when the models run different ops there)
    and where it is, in words."""
    for i, ((op_a, out_a), (op_b, out_b)) in enumerate(zip(ops_a, ops_b, strict=False)):
        if op_a != op_b:
            return f"{op_a} / {op_b}", f"op {i} of the module: {op_a} in model_a, {op_b} in model_b"
        if _diff(out_a, out_b, rtol, atol).beyond:
            return op_a, f"op {i} of the module, {op_a} (replayed on the same input in both models)"
    return None


# -------------------------------------------------------------------------------------------- helpers


def _module_names(model: nn.Module) -> list[str]:
    return [name for name, _ in model.named_modules() if name]


def _check_names(model_a: nn.Module, model_b: nn.Module, mapping: dict[str, str]) -> None:
    """``names=`` must name modules that exist: a typo would silently compare nothing."""
    known_a, known_b = set(_module_names(model_a)), set(_module_names(model_b))
    for a, b in mapping.items():
        if a not in known_a:
            raise KeyError(
                f"compare: names= maps {a!r}, which is not a module of model_a; give model_a's qualified "
                f"names as keys (some: {_head(sorted(known_a))})"
            )
        if b not in known_b:
            raise KeyError(
                f"compare: names= maps {a!r} to {b!r}, which is not a module of model_b; give model_b's "
                f"qualified names as values (some: {_head(sorted(known_b))})"
            )


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _first_shape(value: Any) -> tuple[int, ...] | None:
    tensors = _tensors(value)
    return tuple(tensors[0].shape) if tensors else None


def _shape(t: torch.Tensor) -> str:
    return "×".join(map(str, t.shape)) or "scalar"


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:.3g}"


def _row_cells(row: LayerDiff, first: bool) -> tuple[str, ...]:
    shape = "×".join(map(str, row.shape_a)) if row.shape_a is not None else ""
    if row.shape_b is not None and row.shape_b != row.shape_a:
        shape += " vs " + "×".join(map(str, row.shape_b))
    mark = "<- first" if first else ("!" if row.beyond or row.grad_beyond else "")
    name = row.name + (f" -> {row.name_b}" if row.name_b != row.name else "")
    name += f" (call {row.call})" if row.call else ""
    return (
        name, row.module_type, shape, _num(row.max_abs), _num(row.max_rel), _num(row.grad_max_abs),
        _num(row.param_grad_max_abs), mark + (f" {row.note}" if row.note else ""),
    )  # fmt: skip


def _html_style(row: LayerDiff, first: bool) -> str:
    if first:
        return "background:#fde2e1;font-weight:bold"
    return "background:#fff4e0" if row.beyond or row.grad_beyond else ""


def _only_in(names: list[str], model: str) -> str:
    return f" Only in {model}: {_head(names)}." if names else ""


def _head(names: list[str], n: int = 8) -> str:
    more = f" and {len(names) - n} more" if len(names) > n else ""
    return ", ".join(names[:n]) + more
