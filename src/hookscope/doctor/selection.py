"""Which modules the doctor watches, and which forwards train: the selection predicates.

Each predicate is an ``hs.select`` spec (a function of ``(qualified_name, module)``), so the doctor, the
statistics callbacks and ``hs.watch`` pick their layers with the one selection rule of
:mod:`hookscope.hooks.select`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

# Does this forward train? None: the flag the loop set with begin_batch; else asked of the module.
TrainingOf = Callable[[nn.Module], bool] | None


def with_parameters(name: str, module: nn.Module) -> bool:
    """Selection predicate for leaf modules that own parameters (convs, linears, norms): fastai's default.

    Watching every leaf module (``select=None``) also covers activations and pooling, at about twice
    the cost on a CNN.
    """
    return next(module.children(), None) is None and next(module.parameters(recurse=False), None) is not None


# Modules whose output holds their input's values, reshaped: their statistics repeat the layer before.
RESHAPES = (nn.Flatten, nn.Unflatten, nn.Identity)
PASS_THROUGH = (*RESHAPES, nn.modules.dropout._DropoutNd)
"""Modules that make no units of their own: what their outputs show are their input's units."""


def computing_leaves(name: str, module: nn.Module) -> bool:
    """Selection predicate for every leaf module except those that only reshape (:data:`RESHAPES`): what
    the doctor watches when given ``select=None``. A Flatten's statistics are its input's, and cost as
    much again (the small CNN's Flatten made a seventh of a recorded step)."""
    return next(module.children(), None) is None and not isinstance(module, RESHAPES)


def module_in_training(module: nn.Module) -> bool:
    """A forward that trains: the module in train mode with autograd on (validation runs eval/no_grad).

    Loops that announce no batch (``hs.watch`` in a hand-written loop) ask each forward this instead.
    """
    return module.training and torch.is_grad_enabled()
