"""capture(): record what selected modules receive and produce, forward and backward, keyed by name and call.

Three rules make the recorded data trustworthy (each one is a known bug of hand-written hooks):

- Values are copied when the hook fires. A hook that keeps a reference sees later in-place ops: ResNet's
  ``bn1`` output is overwritten by ``relu(inplace=True)`` a moment later and loses its negative values.
  The copy costs memory; ``reduce=`` (keep a summary), ``to="cpu"`` (offload) and ``max_bytes`` bound it.
- Gradients come from tensor hooks on the output and input tensors, never ``register_full_backward_hook``,
  which raises "a view ... is being modified inplace" when an in-place op follows the module.
- A module called twice in one forward keeps both calls; every hook is owned by a :class:`HookSet` and
  removed on exit, also when the forward or a hook raised.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import torch
from torch import nn

from hookscope import compat
from hookscope._deprecation import renamed_keywords
from hookscope.hooks.handles import HookSet
from hookscope.hooks.select import Spec
from hookscope.hooks.select import select as select_modules
from hookscope.hooks.tensors import map_tensors, tensors_in

KINDS = ("output", "input", "grad_output", "grad_input")


class CaptureLimitError(RuntimeError):
    """Storing one more captured value would exceed the ``max_bytes`` bound given to :func:`capture`."""


@dataclass(frozen=True)
class Record:
    """One captured value: module ``name``, its ``call`` number (0 = first call), ``kind`` and ``value``.

    ``value`` is a tensor, or the module's own structure (tuple, list, dict, named tuple, dataclass: the
    same types, see :func:`~hookscope.hooks.tensors.map_tensors`) of copied tensors when it returned
    several; for ``grad_*`` kinds with several tensors it is a list, one entry per tensor that requires
    grad in flattened order, ``None`` where no gradient flowed.
    """

    name: str
    call: int
    kind: str
    value: Any


class Capture:
    """Recorded values of the modules selected by :func:`capture`; removes its hooks on exit or ``remove()``.

    ``records`` and ``outputs`` list everything in firing order; ``cap[name]`` is the most recent call of a
    module (``cap[name, kind]`` when several kinds are captured); ``cap.calls(name)`` lists every call;
    ``names`` holds the selected module names in model order.
    """

    @renamed_keywords(spec="select")
    def __init__(
        self,
        model: nn.Module,
        select: Spec = None,
        what: str | tuple[str, ...] = "output",
        to: str | torch.device | None = None,
        reduce: Callable[[torch.Tensor], Any] | None = None,
        max_bytes: int | None = None,
    ) -> None:
        self.kinds = _parse_what(what)
        self.to = torch.device(to) if to is not None else None
        self.reduce = reduce
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._records: list[Record] = []
        self._n_calls: dict[str, int] = {}
        self._running: dict[str, list[int]] = {}
        self._hooks = HookSet()
        self._pending_offload: set[torch.device] = set()
        modules = select_modules(model, select)
        self.names = tuple(name for name, _ in modules)
        _refuse_compiled(model, modules)
        try:
            for name, module in modules:
                self._attach(name, module)
        except BaseException:
            self._hooks.remove()
            raise

    @property
    def records(self) -> list[Record]:
        """Every captured value as a :class:`Record`, in firing order."""
        self._wait_for_offload()
        return list(self._records)

    @property
    def outputs(self) -> list[Any]:
        """The captured values in firing order (for several kinds, filter :attr:`records` by kind)."""
        return [record.value for record in self.records]

    def calls(self, name: str, kind: str | None = None) -> list[Any]:
        """Values of every call of module ``name`` in call order; ``kind`` is needed when several are kept."""
        kind = self._one_kind(kind, name)
        found = [record.value for record in self.records if record.name == name and record.kind == kind]
        if found or name in self._n_calls:
            return found
        if name in self.names:
            raise KeyError(f"capture: module {name!r} is selected but has not run inside the with-block yet")
        raise KeyError(self._unknown_name_message(name))

    def __getitem__(self, key: str | tuple[str, str]) -> Any:
        name, kind = key if isinstance(key, tuple) else (key, None)
        values = self.calls(name, kind)
        if not values:
            raise KeyError(
                f"capture: module {name!r} ran but recorded no {kind or self.kinds[0]!r} value yet"
            )
        return values[-1]

    def __contains__(self, name: object) -> bool:
        return any(record.name == name for record in self._records)

    def __len__(self) -> int:
        return len(self._records)

    def __repr__(self) -> str:
        names = {record.name for record in self._records}
        hooks = len(self._hooks)
        return f"Capture({len(self)} records from {len(names)} modules, what={self.kinds}, hooks={hooks})"

    def clear(self) -> None:
        """Forget every record and call count; the hooks stay attached."""
        self._records.clear()
        self._n_calls.clear()
        self.nbytes = 0

    def remove(self) -> None:
        """Remove every hook this capture registered; the records stay readable. Idempotent."""
        self._hooks.remove()

    def __enter__(self) -> Capture:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.remove()

    def _attach(self, name: str, module: nn.Module) -> None:
        # The call number is taken in the pre-hook so that every kind of one call shares it; inputs are
        # copied there too, before an in-place module (ReLU(inplace=True)) overwrites them.
        before = self._guarded(lambda module, args, kwargs: self._before(name, args, kwargs))
        self._hooks.forward_pre(module, before, with_kwargs=True)
        if "output" in self.kinds or "grad_output" in self.kinds:
            after = self._guarded(lambda module, args, output: self._after(name, output))
            self._hooks.forward(module, after)

    def _guarded(self, hook: Callable[..., None]) -> Callable[..., None]:
        """Wrap a hook so that an error inside it removes every hook before propagating."""

        def run(*args: Any) -> None:
            try:
                hook(*args)
            except BaseException:
                self._hooks.remove()
                raise

        return run

    def _before(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        call = self._n_calls.get(name, 0)
        self._n_calls[name] = call + 1
        if "output" in self.kinds or "grad_output" in self.kinds:
            # a stack, so that a module whose forward calls itself pairs each output with its own call
            self._running.setdefault(name, []).append(call)
        inputs = _inputs_value(args, kwargs)
        if "input" in self.kinds:
            self._store(name, call, "input", inputs)
        if "grad_input" in self.kinds:
            self._watch_grads(name, call, "grad_input", inputs)

    def _after(self, name: str, output: Any) -> None:
        call = self._running[name].pop()
        if "output" in self.kinds:
            self._store(name, call, "output", output)
        if "grad_output" in self.kinds:
            self._watch_grads(name, call, "grad_output", output)

    def _watch_grads(self, name: str, call: int, kind: str, value: Any) -> None:
        tensors = [t for t in tensors_in(value) if t.requires_grad]
        kept: list[Any] = [None] * len(tensors)

        def on_grad(grads: list[Any], i: int) -> None:
            if len(grads) == 1:
                self._store(name, call, kind, grads[0])
                return
            # The record enters at the first gradient of this call (its firing position); later ones fill in.
            first = all(slot is None for slot in kept)
            kept[i] = self._kept_within_bound(name, kind, grads[i])
            if first:
                self._records.append(Record(name, call, kind, kept))

        self._hooks.grads(tensors, self._guarded(on_grad))

    def _store(self, name: str, call: int, kind: str, value: Any) -> None:
        self._records.append(Record(name, call, kind, self._kept_within_bound(name, kind, value)))

    def _kept_within_bound(self, name: str, kind: str, value: Any) -> Any:
        """Copy (or reduce) every tensor of ``value``, counting the bytes against ``max_bytes``."""
        if self.reduce is None:
            # a copy is as large as its source: refuse before allocating it, not after
            self._check_bound(_nbytes(value), name, kind)
        kept = map_tensors(self._keep, value)
        size = _nbytes(kept)
        self._check_bound(size, name, kind)
        self.nbytes += size
        return kept

    def _check_bound(self, size: int, name: str, kind: str) -> None:
        if self.max_bytes is None or self.nbytes + size <= self.max_bytes:
            return
        raise CaptureLimitError(
            f"capture: keeping the {kind} of module {name!r} ({size:,} bytes) would exceed "
            f"max_bytes={self.max_bytes:,} ({self.nbytes:,} bytes already kept); raise max_bytes, select "
            "fewer modules, or shrink each value with reduce=..."
        )

    def _keep(self, tensor: torch.Tensor) -> Any:
        """Detach, reduce and move a tensor, copying it unless the result already owns its memory."""
        source = tensor.detach()
        value = self.reduce(source) if self.reduce is not None else source
        if not isinstance(value, torch.Tensor):
            return value
        if self.to is not None:
            from_cuda = value.is_cuda and self.to.type == "cpu"
            if from_cuda:
                self._pending_offload.add(value.device)
            value = value.to(self.to, non_blocking=from_cuda)
        if _may_share_memory(value, source):
            value = value.clone()
        return value

    def _wait_for_offload(self) -> None:
        # Non-blocking device-to-host copies are only complete once the device has caught up.
        while self._pending_offload:
            torch.cuda.synchronize(self._pending_offload.pop())

    def _one_kind(self, kind: str | None, name: str) -> str:
        if kind is None and len(self.kinds) == 1:
            return self.kinds[0]
        if kind is None:
            raise KeyError(
                f"capture: several kinds were captured {self.kinds}; ask for one, e.g. "
                f"cap[{name!r}, {self.kinds[0]!r}] or cap.calls({name!r}, {self.kinds[0]!r})"
            )
        if kind not in self.kinds:
            raise KeyError(f"capture: kind {kind!r} was not captured; this capture holds {self.kinds}")
        return kind

    def _unknown_name_message(self, name: str) -> str:
        closest = difflib.get_close_matches(name, self.names, n=5, cutoff=0.4)
        hint = f"; closest selected names: {', '.join(closest)}" if closest else ""
        return f"capture: module {name!r} is not among the {len(self.names)} selected modules{hint}"


@renamed_keywords(spec="select")
def capture(
    model: nn.Module,
    select: Spec = None,
    what: str | tuple[str, ...] = "output",
    to: str | torch.device | None = None,
    reduce: Callable[[torch.Tensor], Any] | None = None,
    max_bytes: int | None = None,
) -> Capture:
    """Record what the modules of ``model`` selected by ``select`` (see
    :func:`~hookscope.select`; ``None``: every leaf module) see and produce.

    ``what`` is ``"output"``, ``"input"``, ``"grad_output"``, ``"grad_input"`` or a tuple of them; gradients
    are what ``torch.autograd.grad(loss, tensor)`` gives for the module's output/input tensor, recorded while
    ``backward`` runs inside the block. ``to`` moves each copy (``"cpu"`` offloads), ``reduce`` keeps
    ``reduce(tensor)`` instead of the tensor, ``max_bytes`` bounds what is kept (:class:`CaptureLimitError`).
    Use it as a context manager, or call ``.remove()`` yourself.
    """
    return Capture(model, select, what=what, to=to, reduce=reduce, max_bytes=max_bytes)


def _parse_what(what: str | tuple[str, ...]) -> tuple[str, ...]:
    kinds = (what,) if isinstance(what, str) else tuple(what)
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise ValueError(
            f"capture: unknown what={what!r}; use one of {', '.join(map(repr, KINDS))} or a tuple of them"
        )
    return tuple(dict.fromkeys(kinds))


def _inputs_value(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The one positional tensor for the usual ``forward(x)``; else the args, with the kwargs dict last."""
    if kwargs:
        return (*args, kwargs)
    if len(args) == 1:
        return args[0]
    return args


def _refuse_compiled(model: nn.Module, selected: list[tuple[str, nn.Module]]) -> None:
    """Raise when a selected module or one of its parents is compiled with torch.compile.

    Compiled graphs do not guard on module hooks: a hook added after the first compiled call never fires
    (torch 2.14, CPU), so a capture would silently record nothing. Refusing is the honest answer.
    """
    if not compat.compile_in_use():  # nothing can be compiled; skip walking the parents
        return
    parents = {prefix for selected_name, _ in selected for prefix in _self_and_parents(selected_name)}
    for name in sorted(parents):
        module = model.get_submodule(name)
        wrapped = compat.is_compile_wrapper(module)
        if not wrapped and not compat.is_compiled_in_place(module):
            continue
        where = f"module {name!r}" if name else "the model"
        original = f"model.{compat.ORIGINAL_MODULE_ATTR}"
        fix = f"pass {original} and call that" if wrapped and not name else "use an uncompiled model"
        raise TypeError(
            f"capture: {where} is compiled with torch.compile, whose graph silently skips module hooks; "
            f"{fix} inside the with-block"
        )


def _self_and_parents(name: str) -> list[str]:
    parts = name.split(".") if name else []
    return [".".join(parts[:i]) for i in range(len(parts) + 1)]


def _nbytes(value: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors_in(value))


def _may_share_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """False only when ``a`` provably owns its memory (another device, or another storage)."""
    if a.device != b.device:
        return False
    if a.layout != torch.strided or b.layout != torch.strided or a.device.type == "meta":
        return True
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
