"""The non-finite guard's decision, independent of the loop: is this step's update safe to apply?

Cheap device-side checks pile up between two steps — one ``aminmax`` flag per watched module output, one
flag per loss — and :meth:`NonFiniteCheck.decide` adds one fused norm over all gradients and reads ONE
boolean triple on the host, just before the optimizer step. What a loop does with a "no" differs: the
Learner's ``NonFiniteGuard`` rolls the buffers back and cancels the fit, ``hs.watch`` raises
:class:`~hookscope.watching.NonFiniteError` from the optimizer's step pre-hook (so the step never runs).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from hookscope.hooks.handles import HookSet
from hookscope.hooks.select import Spec, select
from hookscope.hooks.stats import several_ranks
from hookscope.hooks.tensors import grad_norms, tensors_in

CHECKS = ("activation", "loss", "gradient")
_MAX_FLAGS = 4096  # batches that never reach a step (no target): fold the flags to keep memory bounded


class NonFiniteCheck:
    """Flags of the activations and losses since the last step, and the decision at the step.

    ``select`` chooses the modules whose outputs are watched (None: every leaf module; ``False``: none,
    the loss and gradients are still checked). ``training(module)`` says whether a forward trains (only
    those are flagged).
    """

    def __init__(self, select: Spec | bool, training: Callable[[nn.Module], bool]) -> None:
        self.select = select
        self.training = training
        self.activation_flags: list[torch.Tensor] = []
        self.loss_flags: list[torch.Tensor] = []
        self._hooks = HookSet()

    def attach(self, model: nn.Module) -> None:
        """Hook the selected modules; flags of an earlier run are dropped."""
        self._hooks.remove()
        self.clear()
        if self.select is False:
            return
        for _, module in select(model, None if self.select is True else self.select):
            self._hooks.forward(module, self._watch)

    def detach(self) -> None:
        self._hooks.remove()

    def loss(self, loss: torch.Tensor) -> None:
        """Flag one loss (stays on the device)."""
        self.loss_flags.append(loss.detach().isfinite().all())

    def decide(self, params: Iterable[nn.Parameter], device: torch.device) -> str | None:
        """None when every flagged activation, loss and present gradient is finite (the flags are then
        cleared); else which of them was not: ``"activation"``, ``"loss"`` or ``"gradient"``.

        The one host read of the guard.
        """
        grads = [p.grad for p in params if p.grad is not None]
        true = torch.ones((), dtype=torch.bool, device=device)
        activation_ok = torch.stack(self.activation_flags).all() if self.activation_flags else true
        grad_ok = grad_norms(grads).isfinite().all() if grads else true
        loss_ok = torch.stack(self.loss_flags).all() if self.loss_flags else true
        ok = _on_every_rank(torch.stack([activation_ok.to(device), loss_ok.to(device), grad_ok.to(device)]))
        if bool(ok.all()):
            self.clear()
            return None
        return CHECKS[int((~ok).nonzero()[0])]

    def clear(self) -> None:
        self.activation_flags, self.loss_flags = [], []

    def state_dict(self) -> dict[str, list[torch.Tensor]]:
        """The flags so far, folded on the device (a checkpoint inside an unchecked group)."""
        return {
            "activation_ok": [torch.stack(self.activation_flags).all()] if self.activation_flags else [],
            "loss_ok": [torch.stack(self.loss_flags).all()] if self.loss_flags else [],
        }

    def load_state_dict(self, state: dict[str, Any], device: torch.device) -> None:
        self.activation_flags = [flag.to(device) for flag in state["activation_ok"]]
        self.loss_flags = [flag.to(device) for flag in state["loss_ok"]]

    def _watch(self, module: nn.Module, args: Any, output: Any) -> None:
        if not self.training(module):
            return
        tensors = [t for t in tensors_in(output) if t.is_floating_point() and t.numel()]
        self.activation_flags.extend(torch.stack(torch.aminmax(t.detach())).isfinite().all() for t in tensors)
        if len(self.activation_flags) > _MAX_FLAGS:
            self.activation_flags = [torch.stack(self.activation_flags).all()]


def _on_every_rank(ok: torch.Tensor) -> torch.Tensor:
    """The check triple ``ok`` on the host; under torchrun each check is passed only if it passed on every
    rank (one all-reduce on the device before the one read), so every rank stops at the same step — a
    rank left waiting in the next step's gradient all-reduce would hang."""
    if several_ranks():
        as_int = ok.to(torch.uint8)
        torch.distributed.all_reduce(as_int, op=torch.distributed.ReduceOp.MIN)
        ok = as_int.bool()
    return ok.cpu()
