"""``stale_gradients``: an optimizer step applies gradients that still hold those of the step before.

A few trainable parameters of the watched optimizer (the first, the middle and the last) carry a host
hook that runs once a backward's gradient was added to ``.grad`` (a post-accumulate hook). Right after
each optimizer step the parameter's ``.grad`` is remembered (a weak reference and its version counter).
Autograd adds a gradient into an existing ``.grad`` in place, one write: a ``.grad`` that is still that
very tensor, written exactly once since the step, received the gradient on top of the previous step's,
and carries it on. ``zero_grad()`` sets ``.grad`` to None (the next backward makes a new tensor) or
zeroes it in place (a second write), and either clears it. (A backward with ``create_graph=True`` adds
out of place, into a new tensor: seen as cleared.) When the next step is about to apply gradients that
still carry the previous step's, the step is stale: named at the second optimizer step of a loop without
``zero_grad``.

Told apart from what is fine by the pattern of backward passes and steps alone:

- deliberate accumulation (k backward passes, a step, then ``zero_grad``): the first backward after the
  step finds ``.grad`` cleared;
- a backward that reaches the parameters between two steps whose gradient is cleared before the next
  step (a GAN's generator loss flowing through the discriminator, cleared by ``netD.zero_grad()``): the
  stale gradient never reaches a step;
- LBFGS and other closures (zero_grad and backward inside ``step``): no backward lands on the previous
  step's gradient between two steps.

The first step after :meth:`StaleGradients.attach` (or a resume) has no previous step to compare with.
Nothing here touches a tensor's values: version counters and identities are host numbers.

The hooks are on only while the protocol looks (:meth:`StaleGradients.watch`, on the steps of
:mod:`~.looks`): each costs a call from autograd into Python at every backward. A look's first step has
no previous step to compare with either, so a missing ``zero_grad`` is named at its second step.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import nn

from hookscope import compat
from hookscope.doctor.findings import Finding
from hookscope.hooks.handles import HookSet

# How many parameters carry the hooks: enough that a parameter left out of one backward (an unused
# branch) does not blind the check, few enough to cost nothing.
WATCHED = 3


class _Watched:
    """One watched parameter: its name, and the gradient the last step left (None: nothing left)."""

    def __init__(self, name: str, param: nn.Parameter) -> None:
        self.name, self.param = name, param
        self.left: tuple[weakref.ref, int] | None = None  # .grad right after the last step, its version
        self.hit = False  # a backward since the last step landed on it

    def carries_last_step(self, writes: int = 0) -> bool:
        """``.grad`` is the tensor the last step left, written ``writes`` times since."""
        grad = self.param.grad
        if grad is None or self.left is None:
            return False
        ref, version = self.left
        return ref() is grad and compat.tensor_version(grad) == version + writes

    def remember(self) -> None:
        grad = self.param.grad
        self.left = None if grad is None else (weakref.ref(grad), compat.tensor_version(grad))


class StaleGradients:
    """Names the first optimizer step that applied gradients of an earlier step (see the module)."""

    def __init__(self) -> None:
        self._hooks = HookSet()
        self._named: list[tuple[str, nn.Parameter]] = []
        self._watched: list[_Watched] = []
        self._on = True  # the hooks are registered (the protocol looks at this step)
        self._step = 0
        self.first: tuple[int, str] | None = None  # (step, parameter) of the first stale step
        self.stale_steps = 0

    def attach(self, model: nn.Module) -> None:
        self._named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        self._hook(self._named)

    def watch_optimizer(self, optimizer: torch.optim.Optimizer | None) -> None:
        """Watch only parameters this optimizer steps: another optimizer's would never look cleared."""
        if optimizer is None:
            return
        stepped = {id(p) for group in optimizer.param_groups for p in group["params"]}
        self._hook([(name, p) for name, p in self._named if id(p) in stepped])

    def begin_batch(self, step: int, training: bool) -> None:
        if training:
            self._step = step

    def watch(self, on: bool) -> None:
        """Hook the watched parameters for the steps the protocol looks at (``on``), unhook them between
        looks; a look starts with nothing remembered."""
        if on != self._on:
            self._on = on
            self._register()

    def gradients_ready(self) -> None:
        """The step is about to apply the gradients: do they still carry the previous step's?"""
        if not self._on:
            return
        stale = [w for w in self._watched if w.hit and w.carries_last_step()]
        if not stale:
            return
        self.stale_steps += 1
        if self.first is None:
            self.first = (self._step, stale[0].name)

    def step_done(self) -> None:
        if not self._on:
            return
        for watched in self._watched:
            watched.remember()
            watched.hit = False

    def close(self) -> None:
        self._hooks.remove()

    def findings(self) -> list[Finding]:
        if self.first is None:
            return []
        step, name = self.first
        message = (
            f"optimizer step {step} applied gradients that still held those of the step before: nothing "
            f"cleared `.grad` between the two steps (checked on `{name}`), so each step adds every earlier "
            "gradient to its own — `optimizer.zero_grad()` is missing, or sits outside the batch loop. "
            "Call `optimizer.zero_grad()` once per optimizer step, after `optimizer.step()` (or before "
            "the forward); to accumulate on purpose, step and zero every k backward passes."
        )
        evidence = {"parameter": name, "stale_steps": self.stale_steps}
        return [Finding("stale_gradients", "", step, "error", message, evidence)]

    def state_dict(self) -> dict[str, Any]:
        """What was found; the gradients left by the last step are not kept (a resumed run starts anew)."""
        return {"first": list(self.first) if self.first else None, "stale_steps": self.stale_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        first = state["first"]
        self.first = (int(first[0]), str(first[1])) if first else None
        self.stale_steps = int(state["stale_steps"])

    def _hook(self, named: list[tuple[str, nn.Parameter]]) -> None:
        picks = sorted({0, len(named) // 2, len(named) - 1}) if named else []
        self._watched = [_Watched(*named[i]) for i in picks[:WATCHED]]
        self._register()

    def _register(self) -> None:
        """Hook each watched parameter (again), with nothing remembered; only unhook them between looks."""
        self._hooks.remove()
        if not self._on:
            return
        for watched in self._watched:
            watched.left, watched.hit = None, False
            self._hooks.param(watched.param, self._arrived(watched))

    @staticmethod
    def _arrived(watched: _Watched) -> Any:
        def hook(param: nn.Parameter) -> None:
            if watched.carries_last_step(writes=1):  # added onto the last step's: follow the sum
                watched.hit = True
                watched.remember()
            else:
                watched.left = None

        return hook
