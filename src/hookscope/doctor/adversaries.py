"""Whether the watched loss is a game: another optimizer trains parameters against it (a GAN).

A generator's loss is the discriminator being fooled; each discriminator step makes it worse, so it is
not meant to fall, and a flat or bouncing curve is no plateau or oscillation. The doctor learns of the
other optimizers of the loop through one mechanism that every loop shares (the Learner's ``Doctor``,
``hs.watch``, the integrations): torch's global optimizer step hook
(``torch.optim.optimizer.register_optimizer_step_post_hook``), registered while the engine is attached
and removed at close or failure. An optimizer ``O'`` that is not the watched one (the Learner's
``learn.opt``, ``hs.watch``'s ``optimizer``; without one, the optimizers holding the watched model's
trainable parameters are the watched side) is an **adversary** of the watched loss when:

- it steps parameters the watched optimizer does not hold (without a watched optimizer: none of the
  watched model's), so it is not a second optimizer over the same model's other parameter groups;
- it steps on a backward pass of its own — its parameters received a gradient in a backward in which
  the watched parameters received none (the discriminator's loss on real and detached fake images) — so
  it is not an optimizer applying the watched loss's own gradients;
- and the watched loss is computed through its parameters: they received a gradient in a backward in
  which the watched parameters did too (the generator's loss through the discriminator), or they were
  frozen (``requires_grad=False``) when the watched optimizer stepped and trained in their own pass (the
  pix2pix/CycleGAN pattern of freezing the opponent);
- and it stepped at least twice: it alternates with the watched one.

Backward passes are told apart by autograd's graph task id, read in a post-accumulate-grad hook on one
"sentinel" parameter per side (the first trainable one). Those hooks exist only once a second optimizer
has stepped, and only until the question is settled (``DECIDE_WITHIN`` watched steps at most): a loop with
one optimizer pays one Python call per optimizer step, no hook on any tensor.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from hookscope import compat
from hookscope.hooks.handles import HookSet

DECIDE_WITHIN = 50
"""Watched steps after the first other optimizer stepped within which the question is settled; after
that the sentinel hooks go (a second optimizer that is no adversary costs nothing from then on)."""


def _global_hook(owner: Adversaries) -> Any:
    """torch's global step hook, holding its owner weakly and removed when the owner is collected: an
    engine dropped without being closed takes its hook with it instead of watching every later
    optimizer."""
    ref = weakref.ref(owner)

    def stepped(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        adversaries = ref()
        if adversaries is not None:
            adversaries._stepped(optimizer)

    handle = register_optimizer_step_post_hook(stepped)
    weakref.finalize(owner, handle.remove)
    return handle


def _params(optimizer: torch.optim.Optimizer) -> list[nn.Parameter]:
    return [p for group in optimizer.param_groups for p in group["params"]]


class _Side:
    """One optimizer's sentinel parameter and the backward passes that reached it."""

    def __init__(self, params: list[nn.Parameter]) -> None:
        self.params = params
        self.tasks: set[int] = set()
        self.steps = 0
        self.frozen_at_watched_step = False
        self.hooked = False


class Adversaries:
    """The other optimizers of the loop that play against the watched loss (see the module docstring).

    Fed by the engine: :meth:`attach` (the watched model), :meth:`watch_optimizer`, :meth:`watched_step`
    (the watched optimizer is about to step) and :meth:`close`. ``game`` says whether one was found;
    ``parameters`` are the ids of the parameters the adversaries step (the watched loss does not move them).
    """

    def __init__(self) -> None:
        self.game = False
        self.names: list[str] = []
        self.parameters: set[int] = set()
        self._model: set[int] = set()
        self._optimizer: weakref.ref[torch.optim.Optimizer] | None = None
        self._global: Any = None
        self._sentinels = HookSet()
        self._watched: _Side | None = None
        self._roles: weakref.WeakKeyDictionary[torch.optim.Optimizer, bool | list[nn.Parameter]]
        self._roles = weakref.WeakKeyDictionary()  # per optimizer, see _role
        self._others: dict[int, _Side] = {}
        self._watched_steps = 0
        self._other_steps = 0
        self._deadline: int | None = None

    def attach(self, model: nn.Module) -> None:
        """Watch the loop's optimizers while ``model`` is watched (the global step hook)."""
        self._model = {id(p) for p in model.parameters() if p.requires_grad}
        if self._global is None and not self.game:
            self._global = _global_hook(self)

    def watch_optimizer(self, optimizer: torch.optim.Optimizer | None) -> None:
        """The watched optimizer (None: those stepping the watched model's parameters are its side)."""
        self._optimizer = weakref.ref(optimizer) if optimizer is not None else None
        self._roles = weakref.WeakKeyDictionary()

    def watched_step(self) -> None:
        """The watched optimizer is about to step: an opponent frozen now is frozen for the watched loss."""
        for side in self._others.values():
            side.frozen_at_watched_step = side.frozen_at_watched_step or not any(
                p.requires_grad for p in side.params
            )

    def close(self) -> None:
        """Remove the global hook and every sentinel: nothing is left registered."""
        if self._global is not None:
            self._global.remove()
            self._global = None
        self._sentinels.remove()
        self._watched, self._others = None, {}
        self._roles = weakref.WeakKeyDictionary()

    # ---- machinery -----------------------------------------------------------------------------------

    def _stepped(self, optimizer: torch.optim.Optimizer) -> None:
        role = self._roles.get(optimizer)
        if role is None:  # once per optimizer: the parameters are not listed at every step
            role = self._roles[optimizer] = self._role(optimizer)
        if role is True:
            self._watched_steps += 1
            if self._watched is None:
                params = _params(optimizer)
                self._watched = _Side([p for p in params if id(p) in self._model] or params)
            self._expire()
            return
        if not role:
            return
        self._other_steps += 1
        if self._other_steps > 2 * DECIDE_WITHIN:  # its watched optimizer never steps (a stale engine)
            self.close()
            return
        theirs = role
        side = self._others.setdefault(id(optimizer), _Side(theirs))
        side.steps += 1
        self._hook(side)
        if self._watched is not None and self._hook(self._watched):
            for other in self._others.values():  # evidence counts from backwards both sentinels saw
                other.tasks.clear()
        if self._deadline is None:
            self._deadline = self._watched_steps + DECIDE_WITHIN
        if self._plays_against(side):
            self._found(optimizer, side)

    def _role(self, optimizer: torch.optim.Optimizer) -> bool | list[nn.Parameter]:
        """True for the watched side; else the parameters it steps that the watched side does not hold
        (an empty list: it is no possible adversary)."""
        params = _params(optimizer)
        watched = self._optimizer() if self._optimizer is not None else None
        if watched is None:
            if any(id(p) in self._model for p in params):
                return True
            return params
        if optimizer is watched:
            return True
        held = {id(p) for p in _params(watched)}
        return [p for p in params if id(p) not in held]

    def _hook(self, side: _Side) -> bool:
        """A post-accumulate-grad hook on the side's first trainable parameter, once; True when hooked now."""
        if side.hooked:
            return False
        sentinel = next((p for p in side.params if p.requires_grad), None)
        if sentinel is None:
            return False  # frozen now: the next step tries again
        self._sentinels.add(
            sentinel.register_post_accumulate_grad_hook(lambda _: side.tasks.add(compat.graph_task_id()))
        )
        side.hooked = True
        return True

    def _plays_against(self, side: _Side) -> bool:
        if self._watched is None or side.steps < 2:
            return False
        own = side.tasks - self._watched.tasks
        joint = side.tasks & self._watched.tasks
        return bool(own) and (bool(joint) or side.frozen_at_watched_step)

    def _found(self, optimizer: torch.optim.Optimizer, side: _Side) -> None:
        self.game = True
        self.names.append(type(optimizer).__name__)
        self.parameters |= {id(p) for p in side.params}
        self.close()

    def _expire(self) -> None:
        """No adversary within ``DECIDE_WITHIN`` watched steps of the first other step: stop looking."""
        if self._deadline is not None and self._watched_steps > self._deadline:
            self.close()
