"""compact(): remove fully pruned channels physically, so MACs, parameters and latency drop.

Masks alone save nothing: a zero weight still costs its multiply. ``compact`` takes every channel that
structured pruning zeroed (a slice along dim 0 of a masked weight, with its bias entry), makes the masks
permanent and removes those channels with Torch-Pruning's dependency graph (Fang et al., DepGraph, CVPR
2023), which also shrinks what depends on them: the next layer's inputs, BatchNorm, concatenations and
the layers a residual addition couples. Which channels go was decided by :func:`~hookscope.pruning.prune`,
so hookscope's activation and Taylor importance choose them. :class:`GroupImportance` offers the same
scores to Torch-Pruning's own pruners (``tp.pruner.MetaPruner(..., importance=GroupImportance(...))``).

Outputs are unchanged (to float rounding) when a removed channel reached the next layer as zero: prune the
layer whose output feeds the next one (a Conv without BatchNorm, or the BatchNorm after a Conv), and no
layer coupled by a residual addition unless all of them are pruned alike. A Conv followed by BatchNorm
turns a zero channel into the constant shift ``beta - gamma * mean / std``, which removal drops.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hookscope.hooks.summary import summary
from hookscope.pruning.importance import Batch, importance
from hookscope.pruning.masks import finalize_pruning, is_masked

INSTALL_HINT = "pip install 'hookscope[pruning]'"


@dataclass(frozen=True)
class CompactReport:
    """What :func:`compact` removed (``removed``: channels per pruned layer) and the model's MACs and
    parameters before and after, counted by ``hs.summary``."""

    removed: dict[str, int]
    macs_before: int
    macs_after: int
    params_before: int
    params_after: int

    def __str__(self) -> str:
        layers = ", ".join(f"{name} -{n}" for name, n in self.removed.items())
        return (
            f"compact: removed {sum(self.removed.values())} channels ({layers}); "
            f"MACs {self.macs_before:,} -> {self.macs_after:,} ({self.macs_after / self.macs_before:.0%}), "
            f"params {self.params_before:,} -> {self.params_after:,}"
        )


def compact(model: nn.Module, example_input: Any) -> CompactReport:
    """Remove, in place, every channel that structured pruning zeroed, with what depends on it.

    ``example_input`` (a tensor, or a tuple of a forward's arguments) traces the dependency graph and counts
    MACs. The masks are made permanent first (:func:`~hookscope.pruning.finalize_pruning`). Refuses a model
    with no entirely pruned channel (unstructured masks leave none: prune with ``structured=True``).
    """
    try:
        import torch_pruning as tp
    except ImportError:
        raise ImportError(
            f"hs.compact needs Torch-Pruning for the dependency graph: {INSTALL_HINT}"
        ) from None
    pruned = _structured_layers(model)
    if not pruned:
        raise ValueError(
            "compact: no masked layer has an entirely pruned channel; prune channels first with "
            "hs.prune(model, spec, amount, structured=True)"
        )
    before = summary(model, example_input)
    finalize_pruning(model)
    removed = _remove(tp, model, example_input, pruned)
    after = summary(model, example_input)
    return CompactReport(
        removed, before.total_macs, after.total_macs, before.total_params, after.total_params
    )


def _structured_layers(model: nn.Module) -> list[str]:
    """Masked layers with at least one output channel entirely masked, in model order."""
    found = []
    for name, module in model.named_modules():
        if is_masked(module, "weight") and _zero_channels(module.weight_mask, getattr(module, "bias", None)):
            found.append(name)
    return found


def _zero_channels(weight: torch.Tensor, bias: torch.Tensor | None) -> list[int]:
    """Output channels whose weight slice (and bias entry) are all exactly zero."""
    zero = (weight.detach().reshape(weight.shape[0], -1) == 0).all(1)
    if isinstance(bias, torch.Tensor):
        zero &= bias.detach() == 0
    return zero.nonzero().flatten().tolist()


def _remove(tp: Any, model: nn.Module, example_input: Any, layers: list[str]) -> dict[str, int]:
    """Prune each layer's zero channels with its dependency group; indices are read afresh per layer,
    since removing one group renumbers the channels of the layers coupled to it."""
    modes = {m: m.training for m in model.modules()}
    model.eval()  # tracing runs a forward: BatchNorm statistics must not move
    try:
        graph = tp.DependencyGraph().build_dependency(model, example_inputs=example_input, verbose=False)
    finally:
        for module, training in modes.items():
            module.training = training
    removed: dict[str, int] = {}
    for name in layers:
        module = model.get_submodule(name)
        channels = _zero_channels(module.weight, getattr(module, "bias", None))
        if not channels:
            continue
        pruner = graph.get_pruner_of_module(module)
        group = graph.get_pruning_group(module, pruner.prune_out_channels, channels)
        if not graph.check_pruning_group(group):
            raise ValueError(
                f"compact: removing channels {channels[:5]} of {name!r} would leave a layer of its group "
                "with no channel; prune a smaller amount"
            )
        group.prune()
        removed[name] = len(channels)
    return removed


class GroupImportance:
    """hookscope's importance as a Torch-Pruning importance: called with a dependency group, it returns
    the scores of the group's root layer's output channels, ``how`` being any of :func:`hookscope.prune`'s
    (``activation`` and ``taylor`` measured through hooks over ``data``; ``taylor`` needs ``loss_func``).

    ``tp.pruner.MetaPruner(model, x, importance=hs.pruning.compact.GroupImportance(model, "activation",
    data), pruning_ratio=0.5)`` then removes channels chosen by mean activation instead of magnitude.
    """

    def __init__(
        self,
        model: nn.Module,
        how: str = "activation",
        data: Iterable[Batch] | None = None,
        loss_func: Callable[..., torch.Tensor] | None = None,
    ) -> None:
        self.model, self.how, self.loss_func = model, how, loss_func
        self.data = list(data) if data is not None else None  # a loader is read once per group

    def __call__(self, group: Any) -> torch.Tensor:
        root = group[0].dep.target.module
        name = next(n for n, m in self.model.named_modules() if m is root)
        scores = importance(
            self.model, [name], self.how, structured=True, data=self.data, loss_func=self.loss_func
        )
        return scores[name][list(group[0].root_idxs)]
