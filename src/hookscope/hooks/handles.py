"""HookSet: the one owner of every hook handle hookscope registers.

Leaked hooks are the classic hook bug: a forgotten handle keeps firing (and holding tensors) long after
the inspection ended. Every feature registers through a HookSet and removes it in ``finally`` (or uses
it as a context manager), so after any exception the model carries no hookscope hook.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from hookscope import compat


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
        return self.add(module.register_forward_pre_hook(fn, with_kwargs=with_kwargs))

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
        handle = module.register_forward_hook(fn, with_kwargs=with_kwargs, always_call=always_call)
        return self.add(handle)

    def tensor(self, tensor: torch.Tensor, fn: Callable[[torch.Tensor], Any]) -> RemovableHandle:
        """Register ``fn(grad)`` on a tensor that requires grad; it fires during backward.

        Unlike ``register_full_backward_hook``, this works when an in-place op follows the module.
        """
        return self.add(tensor.register_hook(fn))

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


def _is_live(handle: RemovableHandle) -> bool:
    """The hook is still registered: its owner exists and still holds it (not removed)."""
    hooks = compat.hook_dict_of(handle)
    return hooks is not None and handle.id in hooks
