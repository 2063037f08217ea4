"""One forward with hooks on every module, recorded as one :class:`Call` per module call, in start order.

The forward runs under ``torch.no_grad`` in eval mode with a pre-hook and two post-hooks on every module.
The pre-hook opens a call (a row); the plain post-hook marks it completed; the ``always_call`` post-hook
closes it even when the forward raised, which is how a failure is pinned on the innermost module that did not
complete. MACs come from :class:`~hookscope.hooks.summary.flops.FlopCounter`: the running FLOP total read when
a call opens and closes, minus what its child calls did, is the work done *in* that module (attention and
matmuls written in a custom ``forward`` included).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hookscope.hooks.handles import HookSet
from hookscope.hooks.summary.result import Shape, SummaryRow
from hookscope.hooks.tensors import tensors_in


@dataclass
class Call:
    """A traced module call: its row plus the bookkeeping that turns FLOP totals into the call's own FLOPs."""

    module: nn.Module
    row: SummaryRow
    parent: int | None
    start_flops: int
    child_flops: int = 0
    own_flops: int = 0
    output_bytes: int = 0
    completed: bool = False


class Tracer:
    """Runs the hooked forward and keeps its :class:`Call` records, also those of a forward that raised.

    ``failed`` is the index of the call the error came from, ``None`` when no module call failed.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        # TorchScript modules refuse hooks: their work and parameters count in the nearest hooked ancestor,
        # and a scripted model is traced as one call, opened and closed around its forward.
        self.scripted_root = isinstance(model, torch.jit.ScriptModule)
        named = [(name, m) for name, m in model.named_modules() if not isinstance(m, torch.jit.ScriptModule)]
        self.names = {id(m): name for name, m in named} | {id(model): ""}
        self.notes = _script_notes(model)
        self.modules = [m for _, m in named]
        # Imported here: torch's FLOP formulas load triton where it is installed, too slow for import time.
        from hookscope.hooks.summary.flops import FlopCounter

        self.counter = FlopCounter()
        self.calls: list[Call] = []
        self.stack: list[int] = []
        self.call_counts: dict[int, int] = {}
        self.failed: int | None = None
        # Activation memory is estimated from leaf outputs only: a container's output is a child's output.
        self.leaves = {id(m) for m in self.modules if next(m.children(), None) is None}

    def run(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], device: torch.device, model_device: torch.device
    ) -> None:
        """Run the forward on ``device`` with every module hooked and FLOPs counted.

        No gradient is computed and no BatchNorm statistic updated; every hook is removed and every module's
        train/eval mode restored afterwards, also when the forward raised.
        """
        with _eval_mode(self.model), torch.no_grad(), HookSet() as hooks:
            self._attach(hooks)
            with self.counter:
                if self.scripted_root:
                    self._run_as_one_call(args, kwargs, device, model_device)
                else:
                    _forward(self.model, args, kwargs, device, model_device)

    def _run_as_one_call(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], device: torch.device, model_device: torch.device
    ) -> None:
        """The forward of a model that refuses hooks, recorded as the one call the hooks would record."""
        self.open(self.model, args, kwargs)
        output = None
        try:
            output = _forward(self.model, args, kwargs, device, model_device)
            self.complete(self.model, args, kwargs, output)
        finally:
            self.close(self.model, args, kwargs, output)

    def open(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Pre-hook: start a call of ``module``, nested in the call that is running."""
        call_number = self.call_counts.get(id(module), 0)
        self.call_counts[id(module)] = call_number + 1
        row = SummaryRow(
            name=self.names[id(module)],
            type=type(module).__name__,
            depth=len(self.stack),
            input_shapes=shapes((args, kwargs) if kwargs else args),
            call=call_number,
        )
        parent = self.stack[-1] if self.stack else None
        self.calls.append(Call(module, row, parent, start_flops=self.counter.total()))
        self.stack.append(len(self.calls) - 1)

    def complete(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        """Post-hook, run only when ``forward`` returned: record the output."""
        call = self.calls[self.stack[-1]]
        call.completed = True
        call.row.output_shapes = shapes(output)
        if id(module) in self.leaves:
            call.output_bytes = nbytes(output)

    def close(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        """Post-hook, run also when ``forward`` raised: settle the call's FLOPs; mark it failed if it did."""
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

    def _attach(self, hooks: HookSet) -> None:
        for module in self.modules:
            hooks.forward_pre(module, self.open, with_kwargs=True)
            hooks.forward(module, self.complete, with_kwargs=True)
            hooks.forward(module, self.close, with_kwargs=True, always_call=True)

    def _encloses(self, outer: int, inner: int) -> bool:
        parent = self.calls[inner].parent
        while parent is not None and parent != outer:
            parent = self.calls[parent].parent
        return parent == outer


def _script_notes(model: nn.Module) -> list[str]:
    """One note per outermost TorchScript module: it has no hooks, so its inner calls have no rows."""
    if isinstance(model, torch.jit.ScriptModule):
        return [
            "the model is TorchScript, which refuses hooks: it is one row, with every parameter and the MACs "
            "of the ops it ran; its submodules get no rows of their own"
        ]
    scripted = [name for name, m in model.named_modules() if isinstance(m, torch.jit.ScriptModule)]
    outermost = [name for name in scripted if not any(name.startswith(f"{other}.") for other in scripted)]
    return [
        f"{name!r} is TorchScript, which refuses hooks: it has no row; its parameters and MACs count in "
        "the row of its nearest listed ancestor"
        for name in outermost
    ]


def shapes(obj: Any) -> list[Shape]:
    """The shape of every tensor in ``obj``, in order."""
    return [tuple(t.shape) for t in tensors_in(obj)]


def nbytes(obj: Any) -> int:
    """Bytes held by the tensors in ``obj``."""
    return sum(t.nbytes for t in tensors_in(obj))


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
