"""summary(): the shapes, parameters and MACs of every module call in one forward, and shape errors explained.

One forward runs under ``torch.no_grad`` in eval mode with a pre-hook and two post-hooks on every module.
The pre-hook opens a *call* (a row); the plain post-hook marks it completed; the ``always_call`` post-hook
closes it even when the forward raised, which is how a failure is pinned on the innermost module that did not
complete. MACs come from :class:`~hookscope.hooks.flops.FlopCounter`: the running FLOP total read when a call
opens and closes, minus what its child calls did, is the work done *in* that module (attention and matmuls
written in a custom ``forward`` included). Parameters are counted once, by the nearest listed module that
holds them, so tied weights and parameters held directly by a container are neither lost nor doubled.
"""

from __future__ import annotations

import copy
import io
import itertools
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text
from torch import nn

from hookscope.hooks.flops import FlopCounter
from hookscope.hooks.handles import HookSet

Shape = tuple[int, ...]


@dataclass
class SummaryRow:
    """One module call: where it sits, what went in and out, the parameters it holds and the MACs it did.

    ``params`` counts the parameters of this module and of descendants not listed as rows of their own; a
    module called again (``call`` 1, 2, ...) shows 0 there, so ``sum(row.params) == total_params``.
    ``macs`` counts multiply-accumulates done in this call outside its listed child calls.
    """

    name: str
    type: str
    depth: int
    input_shapes: list[Shape]
    output_shapes: list[Shape] = field(default_factory=list)
    params: int = 0
    trainable_params: int = 0
    macs: int = 0
    call: int = 0
    failed: bool = False


@dataclass
class Summary:
    """Result of :func:`summary`: one row per module call plus model totals; prints as a table.

    ``failed_module`` is the qualified name of the module whose forward raised ("" for the model's own
    forward), ``None`` when the forward succeeded. ``activation_bytes`` estimates what one forward keeps for
    backward: the bytes of every leaf module's outputs.
    """

    model_type: str
    rows: list[SummaryRow]
    total_params: int
    trainable_params: int
    total_macs: int
    param_bytes: int
    buffer_elements: int
    buffer_bytes: int
    input_bytes: int
    activation_bytes: int
    failed_module: str | None = None

    @property
    def non_trainable_params(self) -> int:
        """Parameters with ``requires_grad=False`` (frozen layers)."""
        return self.total_params - self.trainable_params

    def to_dict(self) -> dict[str, Any]:
        """Plain data (lists, ints, strings) for JSON or a run folder."""
        data = asdict(self)
        data["non_trainable_params"] = self.non_trainable_params
        for row in data["rows"]:
            row["input_shapes"] = [list(s) for s in row["input_shapes"]]
            row["output_shapes"] = [list(s) for s in row["output_shapes"]]
        return data

    def __rich__(self) -> Group:
        return Group(self._table(), Text("\n".join(self._totals())))

    def __str__(self) -> str:
        buffer = io.StringIO()
        # Wide enough that rows never wrap: the table itself is only as wide as its content.
        console = Console(file=buffer, width=1000, color_system=None, force_terminal=False)
        console.print(self)
        return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n"

    def __repr__(self) -> str:
        status = f", failed in {self.failed_module!r}" if self.failed_module is not None else ""
        return (
            f"Summary({self.model_type}, {len(self.rows)} rows, {self.total_params:,} params, "
            f"{_human(self.total_macs, 'MACs')}{status})"
        )

    def _table(self) -> Table:
        partial = " (partial: the forward failed)" if self.failed_module is not None else ""
        title = f"{self.model_type} summary{partial}"
        table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
        table.add_column("Layer (type)")
        table.add_column("Input shape")
        table.add_column("Output shape")
        table.add_column("Param #", justify="right")
        table.add_column("MACs", justify="right")
        for row in self.rows:
            table.add_row(*_cells(row), style="red" if row.failed else None)
        return table

    def _totals(self) -> list[str]:
        lines = [
            f"Total params: {self.total_params:,}",
            f"Trainable params: {self.trainable_params:,}",
            f"Non-trainable params: {self.non_trainable_params:,}",
            f"Total MACs: {_human(self.total_macs)}",
            f"Params size: {_human(self.param_bytes, 'B')}",
            f"Buffers: {self.buffer_elements:,} elements, {_human(self.buffer_bytes, 'B')}",
            f"Input size: {_human(self.input_bytes, 'B')}",
            f"Forward activations (estimate): {_human(self.activation_bytes, 'B')}",
        ]
        if self.failed_module is not None:
            where = repr(self.failed_module) if self.failed_module else "the model's own forward"
            lines.append(f"Forward failed in: {where}")
        return lines


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
    model_device = _model_device(model)
    run_device = torch.device(device) if device is not None else model_device
    _check_device(model_device, run_device)
    with torch.random.fork_rng(devices=_cuda_indices(run_device)):
        args, kw = _inputs(model, example_input, input_size, dtypes, kwargs, run_device)
        tracer = _Tracer(model)
        with _eval_mode(model), torch.no_grad(), HookSet() as hooks:
            tracer.attach(hooks)
            try:
                with tracer.counter:
                    _forward(model, args, kw, run_device, model_device)
            except Exception as exc:
                partial = _build(model, tracer, depth, args, kw, raised=True)
                _add_note(exc, _failure_note(tracer, partial))
                with suppress(AttributeError):  # an exception type with __slots__ cannot carry it
                    exc.summary = partial  # type: ignore[attr-defined]
                raise
    return _build(model, tracer, depth, args, kw, raised=False)


@dataclass
class _Call:
    """A module call being traced: its row plus the bookkeeping that turns FLOP totals into own MACs."""

    module: nn.Module
    row: SummaryRow
    parent: int | None
    start_flops: int
    child_flops: int = 0
    own_flops: int = 0
    output_bytes: int = 0
    completed: bool = False


class _Tracer:
    """Hook callbacks that record one :class:`_Call` per module call, in the order calls start."""

    def __init__(self, model: nn.Module) -> None:
        # TorchScript modules refuse hooks: their work and parameters count in the nearest hooked ancestor.
        named = [(name, m) for name, m in model.named_modules() if not isinstance(m, torch.jit.ScriptModule)]
        self.names = {id(m): name for name, m in named}
        self.modules = [m for _, m in named]
        self.counter = FlopCounter()
        self.calls: list[_Call] = []
        self.stack: list[int] = []
        self.call_counts: dict[int, int] = {}
        self.failed: int | None = None
        # Activation memory is estimated from leaf outputs only: a container's output is a child's output.
        self.leaves = {id(m) for m in self.modules if next(m.children(), None) is None}

    def attach(self, hooks: HookSet) -> None:
        for module in self.modules:
            hooks.forward_pre(module, self.open, with_kwargs=True)
            hooks.forward(module, self.complete, with_kwargs=True)
            hooks.forward(module, self.close, with_kwargs=True, always_call=True)

    def open(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        call_number = self.call_counts.get(id(module), 0)
        self.call_counts[id(module)] = call_number + 1
        row = SummaryRow(
            name=self.names[id(module)],
            type=type(module).__name__,
            depth=len(self.stack),
            input_shapes=_shapes((args, kwargs) if kwargs else args),
            call=call_number,
        )
        parent = self.stack[-1] if self.stack else None
        self.calls.append(_Call(module, row, parent, start_flops=self.counter.total()))
        self.stack.append(len(self.calls) - 1)

    def complete(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        call = self.calls[self.stack[-1]]
        call.completed = True
        call.row.output_shapes = _shapes(output)
        if id(module) in self.leaves:
            call.output_bytes = _bytes(output)

    def close(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        index = self.stack.pop()
        call = self.calls[index]
        inclusive = self.counter.total() - call.start_flops
        call.own_flops = inclusive - call.child_flops
        if call.parent is not None:
            self.calls[call.parent].child_flops += inclusive
        if not call.completed:
            call.row.failed = True
            # The culprit is the innermost call of the chain the error propagates through: a failure caught
            # and recovered from inside the forward is replaced by a later one, but not by its ancestors.
            if self.failed is None or not self._encloses(index, self.failed):
                self.failed = index

    def _encloses(self, outer: int, inner: int) -> bool:
        parent = self.calls[inner].parent
        while parent is not None and parent != outer:
            parent = self.calls[parent].parent
        return parent == outer


def _build(
    model: nn.Module, tracer: _Tracer, depth: int | None, args: Any, kwargs: Any, raised: bool
) -> Summary:
    kept = [i for i, call in enumerate(tracer.calls) if depth is None or call.row.depth <= depth]
    macs = _fold_macs(tracer.calls, set(kept))
    rows = [tracer.calls[i].row for i in kept]
    params = _param_owners(model, {row.name for row in rows})
    for i, row in zip(kept, rows, strict=True):
        row.macs = macs[i] // 2
        if row.call == 0:
            row.params, row.trainable_params = params.get(row.name, (0, 0))
    unique_params = list(model.parameters())
    unique_buffers = list(model.buffers())
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
        input_bytes=_bytes((args, kwargs)),
        activation_bytes=sum(c.output_bytes for c in tracer.calls),
        failed_module=failed,
    )


def _fold_macs(calls: list[_Call], kept: set[int]) -> dict[int, int]:
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
        owner = name.rpartition(".")[0]
        while owner and owner not in listed:
            owner = owner.rpartition(".")[0]
        total, trainable = counts.get(owner, (0, 0))
        counts[owner] = (total + p.numel(), trainable + (p.numel() if p.requires_grad else 0))
    return counts


def _inputs(
    model: nn.Module,
    example_input: Any,
    input_size: Sequence[int] | Sequence[Sequence[int]] | None,
    dtypes: Sequence[torch.dtype] | None,
    kwargs: dict[str, Any],
    device: torch.device,
) -> tuple[tuple[Any, ...], dict[str, Any]]:
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
    one_shape = all(isinstance(d, int) for d in input_size)
    shapes = [tuple(input_size)] if one_shape else [tuple(s) for s in input_size]  # type: ignore[arg-type]
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


def _forward(
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    device: torch.device,
    model_device: torch.device,
) -> Any:
    if device.type == "meta" and model_device.type != "meta":
        # Swap in shape-only copies of the weights for this one call: nothing is computed or allocated.
        state = {
            name: t.to("meta") for name, t in itertools.chain(model.named_parameters(), model.named_buffers())
        }
        return torch.func.functional_call(model, state, args, kwargs)
    return model(*args, **kwargs)


@contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    """Eval mode while summarising (no BatchNorm statistics updated), then every module's own mode back."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


def _model_device(model: nn.Module) -> torch.device:
    first = next(itertools.chain(model.parameters(), model.buffers()), None)
    return first.device if first is not None else torch.device("cpu")


def _check_device(model_device: torch.device, device: torch.device) -> None:
    if device.type in ("meta", model_device.type):
        return
    raise ValueError(
        f"hs.summary: the model is on {model_device} but device={device}; move the model first "
        f"(model.to('{device}')), leave device=None, or use device='meta' to compute nothing"
    )


def _cuda_indices(device: torch.device) -> list[int]:
    if device.type != "cuda":
        return []
    return [device.index if device.index is not None else torch.cuda.current_device()]


def _float_dtype(model: nn.Module) -> torch.dtype:
    floating = (p.dtype for p in model.parameters() if p.dtype.is_floating_point)
    return next(floating, torch.float32)


def _to_device(obj: Any, device: torch.device) -> Any:
    """``obj`` with its tensors on ``device``; returned as it is when they already are there, so custom
    containers (a tokenizer's batch, a dataclass-like mapping) reach ``forward`` untouched."""
    if all(t.device == device for t in _tensors(obj)):
        return obj
    return _moved(obj, device)


def _moved(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, MutableMapping):
        moved = copy.copy(obj)  # keeps the mapping's own type (OrderedDict, defaultdict, UserDict, ...)
        for key, value in obj.items():
            moved[key] = _moved(value, device)
        return moved
    if isinstance(obj, Mapping):
        return {key: _moved(value, device) for key, value in obj.items()}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_moved(value, device) for value in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_moved(value, device) for value in obj)
    return obj


def _tensors(obj: Any) -> list[torch.Tensor]:
    """Every tensor in nested tuples, lists and dicts, in order (a loop, not recursion: it runs per call)."""
    found: list[torch.Tensor] = []
    pending = [obj]
    while pending:
        item = pending.pop()
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif isinstance(item, (list, tuple)):
            pending.extend(reversed(item))
        elif isinstance(item, Mapping):
            pending.extend(reversed(list(item.values())))
    return found


def _shapes(obj: Any) -> list[Shape]:
    return [tuple(t.shape) for t in _tensors(obj)]


def _bytes(obj: Any) -> int:
    return sum(t.nbytes for t in _tensors(obj))


def _add_note(exc: BaseException, note: str) -> None:
    """Append ``note`` to the error without changing its type or traceback."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
        return
    # Python 3.10 has no add_note: extend the message itself, which keeps the type as well.
    first = f"{exc.args[0]}\n{note}" if exc.args and isinstance(exc.args[0], str) else note
    exc.args = (first, *exc.args[1:])


def _failure_note(tracer: _Tracer, partial: Summary) -> str:
    where = f"the forward of {partial.model_type}"
    if tracer.failed is None:
        return f"hookscope.summary: {where} failed before any module ran"
    call = tracer.calls[tracer.failed]
    row = call.row
    if row.name:
        where = f"module '{row.name}' ({row.type})"
    received = _format_shapes(row.input_shapes) or "no tensors"
    expectation = _expectation(call.module, row.input_shapes)
    return (
        f"hookscope.summary: the forward failed in {where}, which received {received}; {expectation}\n"
        f"shapes that led there: {_chain(tracer, tracer.failed)}; "
        f"the partial table ({len(partial.rows)} module calls) is attached: print(exc.summary)"
    )


def _chain(tracer: _Tracer, failed: int) -> str:
    """Output shapes of the last leaf modules that completed (all before the failure), oldest first."""
    done = [
        c.row
        for c in tracer.calls
        if c.completed and next(c.module.children(), None) is None and c.row.output_shapes
    ]
    steps = [f"{row.name} {_format_shapes(row.output_shapes)}" for row in done[-6:]]
    start = [f"input {_format_shapes(tracer.calls[0].row.input_shapes)}"]
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
    conv_types = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
    if isinstance(module, conv_types):
        return _conv_expectation(module, got) or described
    channel_types = (
        nn.BatchNorm1d,
        nn.BatchNorm2d,
        nn.BatchNorm3d,
        nn.SyncBatchNorm,
        nn.InstanceNorm1d,
        nn.InstanceNorm2d,
        nn.InstanceNorm3d,
    )
    if isinstance(module, channel_types) and len(got) > 1 and got[1] != module.num_features:
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


def _cells(row: SummaryRow) -> tuple[str, str, str, str, str]:
    label = row.name or "(model)"
    layer = f"{'  ' * row.depth}{label} ({row.type})"
    if row.call:
        layer += f" · call {row.call + 1}"
    output = "✗ failed" if row.failed else _format_shapes(row.output_shapes) or "--"
    params = "(reused)" if row.call else f"{row.params:,}" if row.params else "--"
    macs = _human(row.macs) if row.macs else "--"
    return layer, _format_shapes(row.input_shapes) or "--", output, params, macs


def _format_shapes(shapes: list[Shape], limit: int = 3) -> str:
    shown = ", ".join(str(list(s)) for s in shapes[:limit])
    return shown + (f", … (+{len(shapes) - limit})" if len(shapes) > limit else "")


def _human(n: int, unit: str = "") -> str:
    """``3.66 G``, ``87.19 MB``, ``96``: decimal prefixes, as torchinfo prints them."""
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {prefix}{unit}"
    return f"{n} {unit}".rstrip()
