"""patch(): replace what selected modules return, for the duration of a ``with`` block.

``with hs.patch(model, {"layer2": fn}):`` makes every call of ``layer2`` return ``fn(output, module,
name)`` (``None`` keeps the output); a tensor in place of ``fn`` is returned as the output (one captured
from another input with ``hs.capture``: activation patching), and a list of tensors gives call ``i`` the
``i``-th. A key ``(spec, i)`` patches only call ``i`` of a module that runs several times per forward;
calls are counted from 0 at every forward of ``model``. Every hook is owned by a :class:`HookSet` and
removed when the block ends, also when it raised: afterwards the model computes what it computed before.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias

import torch
from torch import nn

from hookscope.hooks.handles import HookSet
from hookscope.hooks.select import Spec, select

PatchFn: TypeAlias = Callable[[Any, nn.Module, str], Any]
PatchValue: TypeAlias = PatchFn | torch.Tensor | Sequence[torch.Tensor]


class Patch(HookSet):
    """The hooks of one :func:`patch` (a :class:`HookSet`: a context manager, removed on exit or
    ``remove()``); ``applied[name]`` counts the outputs replaced so far."""

    def __init__(self, model: nn.Module, patches: Mapping[Any, PatchValue]) -> None:
        super().__init__()
        self.applied: dict[str, int] = {}
        self._calls: dict[str, int] = {}
        try:
            self.forward_pre(model, lambda module, args: self._calls.clear())
            counted: set[str] = set()
            for key, value in patches.items():
                spec, only_call = _parse_key(key)
                for name, module in select(model, spec):
                    if name not in counted:
                        self.forward_pre(module, lambda m, args, name=name: self._count(name))
                        counted.add(name)
                    self.forward(module, self._hook(name, only_call, value))
        except BaseException:
            self.remove()
            raise

    def _count(self, name: str) -> None:
        self._calls[name] = self._calls.get(name, 0) + 1

    def _hook(self, name: str, only_call: int | None, value: PatchValue) -> Callable[..., Any]:
        def replace(module: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
            call = self._calls.get(name, 1) - 1
            if only_call is not None and call != only_call:
                return None
            new = _replacement(value, output, module, name, call)
            if new is not None:
                self.applied[name] = self.applied.get(name, 0) + 1
            return new

        return replace


def patch(model: nn.Module, patches: Mapping[Any, PatchValue]) -> Patch:
    """Replace the outputs of the modules selected by each key of ``patches`` (a name, glob, type or any
    ``hs.select`` spec; or ``(spec, call_index)``) by the value: ``fn(output, module, name)``, a tensor, or a
    list of tensors, one per call. Use as a context manager; the hooks go when the block ends."""
    if not isinstance(patches, Mapping) or not patches:
        raise TypeError(
            "patch: pass a non-empty dict {module name or spec: fn(output, module, name) or tensor}, e.g. "
            "hs.patch(model, {'layer1': lambda out, m, name: out * 0})"
        )
    return Patch(model, patches)


def _parse_key(key: Any) -> tuple[Spec, int | None]:
    """``(spec, call)`` for a per-call key, ``(key, None)`` otherwise."""
    if isinstance(key, tuple) and len(key) == 2 and isinstance(key[1], int) and not isinstance(key[1], bool):
        return key[0], key[1]
    return key, None


def _replacement(value: PatchValue, output: Any, module: nn.Module, name: str, call: int) -> Any:
    if isinstance(value, torch.Tensor):
        return _fitted(value, output, name)
    if isinstance(value, Sequence) and not isinstance(value, str):
        if call >= len(value):
            raise IndexError(
                f"patch: module {name!r} ran a call {call} but {len(value)} tensors were given, one per "
                "call; give one for every call, or patch a single call with the key (name, index)"
            )
        return _fitted(value[call], output, name)
    if callable(value):
        return value(output, module, name)
    raise TypeError(f"patch: the value for {name!r} is a {type(value).__name__}; pass a function or a tensor")


def _fitted(tensor: torch.Tensor, output: Any, name: str) -> torch.Tensor:
    """``tensor`` as the module's output: same shape, on the output's device and dtype."""
    if not isinstance(output, torch.Tensor):
        raise TypeError(
            f"patch: module {name!r} returns a {type(output).__name__}, not a tensor; patch it with a "
            "function fn(output, module, name) that rebuilds the structure"
        )
    if tensor.shape != output.shape:
        raise ValueError(
            f"patch: the tensor for {name!r} has shape {tuple(tensor.shape)} but the module returns "
            f"{tuple(output.shape)}; capture it from an input of the same shape"
        )
    return tensor.to(device=output.device, dtype=output.dtype)
