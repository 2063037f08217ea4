"""HookSet: the one owner of every hook handle hookscope registers.

Leaked hooks are the classic hook bug: a forgotten handle keeps firing (and holding tensors) long after
the inspection ended. Every feature registers through a HookSet and removes it in ``finally`` (or uses
it as a context manager), so after any exception the model carries no hookscope hook.

On a ``torch.compile``d model the hooks stay out of the compiler's way. Module hooks run under
``torch.compiler.disable``: dynamo does not trace hookscope's Python (which would guard on counters that
change every call and recompile until its limit). Hooks that are on only for some steps
(:class:`SwitchedHooks`) run with compiled code set to eager while they are on, so the compiled graph
never contains them: it stays the graph of the model alone, without a graph break per hooked module.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from hookscope import compat
from hookscope.hooks.tensors import tensors_in

# fn(module, grad_input, grad_output) -> None or replacement grad_input, as for register_full_backward_hook
BackwardHook = Callable[[nn.Module, tuple[Any, ...], tuple[Any, ...]], Any]
# on_grad(grads, i): gradient i has just arrived in grads[i]; a tensor returned replaces it
GradCallback = Callable[[list[Any], int], Any]


class HookSet:
    """Registers module, tensor and parameter hooks and removes all of them at once.

    ``remove()`` is idempotent, ``len()`` counts handles still live, and leaving a ``with`` block
    removes everything, also when the block raised.
    """

    def __init__(self) -> None:
        self._handles: list[RemovableHandle] = []
        self._prune_at = 64

    def forward_pre(
        self, module: nn.Module, fn: Callable[..., Any], *, with_kwargs: bool = False
    ) -> RemovableHandle:
        """Register ``fn(module, args[, kwargs])`` to run before ``module.forward``."""
        return self.add(module.register_forward_pre_hook(_untraced(fn), with_kwargs=with_kwargs))

    def forward(
        self,
        module: nn.Module,
        fn: Callable[..., Any],
        *,
        with_kwargs: bool = False,
        always_call: bool = False,
    ) -> RemovableHandle:
        """Register ``fn(module, args[, kwargs], output)`` to run after ``module.forward``.

        ``always_call=True`` runs it also when the forward raised (used to keep partial results).
        """
        handle = module.register_forward_hook(_untraced(fn), with_kwargs=with_kwargs, always_call=always_call)
        return self.add(handle)

    def tensor(self, tensor: torch.Tensor, fn: Callable[[torch.Tensor], Any]) -> RemovableHandle:
        """Register ``fn(grad)`` on a tensor that requires grad; it fires during backward.

        Unlike ``register_full_backward_hook``, this works when an in-place op follows the module.
        """
        return self.add(tensor.register_hook(fn))

    def grads(self, tensors: Sequence[torch.Tensor], on_grad: GradCallback) -> list[Any]:
        """Hook every tensor that requires grad; returns ``grads``, one slot per tensor, None until filled.

        As backward reaches tensor ``i``, its gradient lands in ``grads[i]`` and ``on_grad(grads, i)`` runs;
        a tensor it returns replaces that gradient. Tensors without grad keep None. A tensor modified in
        place after this call still reports the gradient of the value it held here.
        """
        grads: list[Any] = [None] * len(tensors)

        def arrived(grad: torch.Tensor, i: int) -> Any:
            grads[i] = grad
            return on_grad(grads, i)

        for i, tensor in enumerate(tensors):
            if tensor.requires_grad:
                self.tensor(tensor, lambda grad, i=i: arrived(grad, i))
        return grads

    def backward(self, module: nn.Module, fn: BackwardHook) -> None:
        """Register ``fn(module, grad_input, grad_output)`` like ``register_full_backward_hook``, built on
        tensor hooks so that it also works when an in-place op follows the module.

        ``grad_output`` holds the gradient of each output tensor, ``grad_input`` that of each positional
        input tensor (None where it needs no grad), as ``torch.autograd.grad`` gives them for those tensors:
        an input that also feeds other layers (a residual path) includes their share. ``fn`` runs once all
        input gradients arrived (after the output gradients when no input needs grad). It may return a
        replacement ``grad_input`` when one input needs grad; with several, the first ones already flowed on,
        so a returned value raises ``TypeError``.
        """
        running: list[_BackwardCall] = []  # a stack: a module calling itself pairs each output with its call

        def before(module: nn.Module, args: tuple[Any, ...]) -> None:
            inputs = tensors_in(args)
            call = _BackwardCall(module, fn, sum(t.requires_grad for t in inputs))
            call.grad_input = self.grads(inputs, call.on_input)
            running.append(call)

        def after(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            call = running.pop()
            call.grad_output = self.grads(tensors_in(output), call.on_output)

        self.forward_pre(module, before)
        # always_call: a forward that raised still pops its call off the stack
        self.forward(module, after, always_call=True)

    def param(self, param: nn.Parameter, fn: Callable[[nn.Parameter], Any]) -> RemovableHandle:
        """Register ``fn(param)`` to run once ``param.grad`` has been accumulated for this backward."""
        return self.add(param.register_post_accumulate_grad_hook(fn))

    def add(self, handle: RemovableHandle) -> RemovableHandle:
        """Take ownership of a handle registered elsewhere."""
        self._handles.append(handle)
        if len(self._handles) >= self._prune_at:
            # Tensor hooks die with their tensor after each backward; forgetting their handles keeps a
            # long-lived HookSet (one per training run) from growing by a handle per step.
            self._handles = [h for h in self._handles if _is_live(h)]
            self._prune_at = max(64, 2 * len(self._handles))
        return handle

    def remove(self) -> None:
        """Remove every handle; calling it again does nothing."""
        while self._handles:
            self._handles.pop().remove()

    def __len__(self) -> int:
        return sum(1 for handle in self._handles if _is_live(handle))

    def __enter__(self) -> HookSet:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.remove()


class SwitchedHooks:
    """Forward hooks on a fixed set of modules, registered only while switched on.

    For hooks needed on some steps only (statistics taken every 50th step): a module with any forward
    hook leaves torch's hook-free call path, and each hook is a Python call even when it returns at once,
    so removing them between those steps costs less than keeping them. ``targets`` replaces the
    ``(module, fn)`` pairs (keeping the switch as it is); ``clear()`` removes the hooks and forgets them.

    While any of them is on, ``torch.compile``d code runs eagerly (:class:`_EagerWhileOn`) until
    :meth:`rest` (the step's end): the hooks see the eager model, and the compiled graph, built on the
    steps without hooks, has none of them.
    """

    def __init__(self) -> None:
        self._pairs: list[tuple[nn.Module, Callable[..., Any]]] = []
        self._hooks = HookSet()
        self.on = False

    def targets(self, pairs: Sequence[tuple[nn.Module, Callable[..., Any]]]) -> None:
        """Hook these ``(module, fn)`` pairs from now on (now, if switched on)."""
        on = self.on
        self.switch(False)
        self._pairs = list(pairs)
        self.switch(on)

    def switch(self, on: bool) -> None:
        """Register every hook (``on``) or remove them; switching to the current state registers nothing
        (on again after :meth:`rest`, compiled code runs eagerly again)."""
        if on == self.on:
            if on and self._pairs:
                _EAGER.hold(self)
            return
        self.on = on
        if not on:
            _EAGER.release(self)
            self._hooks.remove()
            return
        if self._pairs:
            _EAGER.hold(self)
        for module, fn in self._pairs:
            self._hooks.forward(module, fn)

    def rest(self) -> None:
        """The recorded step or phase ended: compiled code may run compiled again, the hooks stay
        registered for a next recorded one (switched on again) or until switched off. Owners call it at
        each end, so that one dropped between steps leaves no process-wide eager stance behind."""
        _EAGER.release(self)

    def clear(self) -> None:
        """Remove every hook and forget the targets: switching on again hooks nothing."""
        self.switch(False)
        self._pairs = []


class _EagerWhileOn:
    """Compiled code runs eagerly while some :class:`SwitchedHooks` are on (``torch.compiler.set_stance``
    ``"force_eager"``), the stance before restored when the last one goes off, or is garbage collected
    while on (an owner dropped without switching it off must not leave the process eager).

    Nothing happens when dynamo is not loaded (no compile and no optimizer in the process), nor when the
    switch comes from inside a compiled region, where torch refuses to change the stance: there the hooks
    are left to the compiled code, which breaks its graph at each (they run under
    ``torch.compiler.disable``).
    """

    def __init__(self) -> None:
        self._holders: dict[int, weakref.finalize] = {}
        self._stance: Any = None  # torch's stance object while eager is forced: exiting it restores

    def hold(self, holder: SwitchedHooks) -> None:
        if id(holder) not in self._holders:
            self._holders[id(holder)] = weakref.finalize(holder, self._gone, id(holder))
        if self._stance is not None or not compat.compile_in_use():
            return
        try:
            self._stance = torch.compiler.set_stance("force_eager")
        except RuntimeError:  # "attempted to set_stance in a torch.compile region"
            self._stance = None

    @property
    def forcing(self) -> bool:
        return self._stance is not None

    def release(self, holder: SwitchedHooks) -> None:
        finalizer = self._holders.get(id(holder))
        if finalizer is not None:
            finalizer.detach()
        self._gone(id(holder))

    def _gone(self, holder: int) -> None:
        self._holders.pop(holder, None)
        if self._holders or self._stance is None:
            return
        stance, self._stance = self._stance, None
        try:
            stance.__exit__(None, None, None)
        except RuntimeError:  # inside a compiled region: restored when the next holder goes
            self._stance = stance


_EAGER = _EagerWhileOn()


def eager_forced() -> bool:
    """Whether compiled code runs eagerly now because some :class:`SwitchedHooks` are on (a step the
    doctor records): such a step is slower than the compiled ones by the doctor's choice."""
    return _EAGER.forcing


@dataclass
class _BackwardCall:
    """One call of a module hooked by :meth:`HookSet.backward`: its gradients, filled in during backward."""

    module: nn.Module
    fn: BackwardHook
    inputs_needing_grad: int = 0
    grad_input: list[Any] = field(default_factory=list)
    grad_output: list[Any] = field(default_factory=list)

    def on_input(self, grads: list[Any], i: int) -> torch.Tensor | None:
        if _arrived(grads) < self.inputs_needing_grad:
            return None
        return self._fire(replaceable=self.inputs_needing_grad == 1)

    def on_output(self, grads: list[Any], i: int) -> None:
        # With an input that needs grad, fn waits for it: input gradients arrive after the output ones.
        if not self.inputs_needing_grad and _arrived(grads) == len(grads):
            self._fire(replaceable=False)

    def _fire(self, replaceable: bool) -> torch.Tensor | None:
        result = self.fn(self.module, tuple(self.grad_input), tuple(self.grad_output))
        if result is None:
            return None
        if not replaceable:
            raise TypeError(
                f"HookSet.backward: the hook on {type(self.module).__name__} returned a value; a replacement "
                "grad_input is supported only when exactly one input tensor needs grad (return None instead)"
            )
        return _single_replacement(result, self.module)


def _arrived(grads: list[Any]) -> int:
    return sum(g is not None for g in grads)


def _single_replacement(result: Any, module: nn.Module) -> torch.Tensor | None:
    """The one gradient in ``fn``'s returned ``grad_input`` (a tuple, as torch takes it, or a bare tensor)."""
    replacement = result[0] if isinstance(result, (tuple, list)) and len(result) == 1 else result
    if replacement is None or isinstance(replacement, torch.Tensor):
        return replacement
    raise TypeError(
        f"HookSet.backward: the hook on {type(module).__name__} must return None or a 1-tuple holding the "
        f"replacement gradient of its input, got {type(result).__name__}"
    )


def _untraced(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` wrapped so that dynamo runs it as it is instead of tracing it (about 0.3 µs a call, 5 µs to
    wrap); ``fn`` itself when dynamo is not loaded, so that a process that compiles nothing and made no
    optimizer (a summary, inference) need not import it. A training loop has loaded it (see
    :func:`compat.compile_in_use`), and a model compiled after the hooks were registered still finds
    them wrapped."""
    return torch.compiler.disable(fn) if compat.compile_in_use() else fn


def _is_live(handle: RemovableHandle) -> bool:
    """The hook is still registered: its owner exists and still holds it (not removed)."""
    hooks = compat.hook_dict_of(handle)
    return hooks is not None and handle.id in hooks
