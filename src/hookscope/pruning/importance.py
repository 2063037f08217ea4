"""How much each weight or channel matters: magnitude, random, activation and first-order Taylor scores.

``activation`` and ``taylor`` are measured through hooks, the point of article 003: a forward hook on each
selected module reads what it produced (and, for ``taylor``, a tensor hook on that output reads the
gradient arriving there), over the batches of ``data``. Scores are returned per module, one per unit
(channel or feature) for structured pruning, one per weight otherwise. Higher means more important.

- ``l1``: ``|w|``; structured, the L1 norm of each slice along ``dim``.
- ``random``: uniform noise from torch's global generator (seed it for a repeatable choice).
- ``activation``: mean ``|activation|`` of each unit over ``data``, output units for ``dim=0`` and input
  units for ``dim=1``; per weight, ``|w|`` times the mean ``|input|`` of the input unit it reads (the
  weight-times-activation score of Wanda, Sun et al. 2023, with a mean instead of an L2 norm).
- ``taylor``: first-order Taylor estimate of the loss change when the unit is removed (Molchanov et al.
  2017/2019): per unit, the mean over samples of ``|sum over positions of activation x gradient|``; per
  weight, ``|w x dL/dw|`` with ``dL/dw`` summed over ``data``. Needs ``loss_func(pred, target)``.

Measurement runs the model in eval mode (BatchNorm statistics and dropout untouched) and leaves every
parameter's ``.grad`` as it was: the gradient is taken with ``torch.autograd.grad``, not ``backward``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from hookscope._deprecation import renamed_keywords
from hookscope.hooks.ablate import Batch, Split, evaluating, split_batches, unit_axis
from hookscope.hooks.handles import HookSet
from hookscope.hooks.select import Spec
from hookscope.hooks.select import select as select_modules
from hookscope.hooks.tensors import first_tensor

HOWS = ("l1", "random", "activation", "taylor")


@renamed_keywords(spec="select")
def importance(
    model: nn.Module,
    select: Spec,
    how: str = "l1",
    *,
    structured: bool = False,
    dim: int = 0,
    data: Iterable[Batch] | None = None,
    loss_func: Callable[..., torch.Tensor] | None = None,
    name: str = "weight",
) -> dict[str, torch.Tensor]:
    """Scores of every module selected by ``select`` (``{qualified name: scores}``), higher = keep.

    ``structured``: one score per slice of the weight along ``dim`` (a channel for ``dim=0``), else one
    per weight, shaped like it. ``data`` (batches as a loader yields them: ``(x, y)`` or ``x``) is needed
    for ``activation`` and ``taylor``; ``taylor`` also needs ``loss_func``.
    """
    modules = weighted_modules(model, select, name)
    _check_how(how, data, loss_func)
    if how == "l1":
        return {n: _l1(_weight(m, name), structured, dim) for n, m in modules}
    if how == "random":
        return {n: _random(_weight(m, name), structured, dim) for n, m in modules}
    batches = _batches(data, how)
    if how == "activation":
        return _activation_scores(model, modules, batches, structured, dim, name)
    return _taylor_scores(model, modules, batches, loss_func, structured, dim, name)


@renamed_keywords(spec="select")
def activation_importance(
    model: nn.Module, select: Spec, data: Iterable[Batch], *, dim: int = 0
) -> dict[str, torch.Tensor]:
    """Mean ``|activation|`` per unit of each selected module over ``data`` (output units for ``dim=0``,
    input units for ``dim=1``): the unit axis is the last one for ``nn.Linear``, axis 1 otherwise."""
    modules = select_modules(model, select)
    return _unit_activation(model, modules, _batches(data, "activation"), "input" if dim == 1 else "output")


def weighted_modules(model: nn.Module, select: Spec, name: str = "weight") -> list[tuple[str, nn.Module]]:
    """The modules of ``select`` that hold a tensor ``name`` (masked or not); refuses an empty selection."""
    selected = select_modules(model, select)
    found = [(n, m) for n, m in selected if isinstance(getattr(m, name, None), torch.Tensor)]
    if found:
        return found
    raise ValueError(
        f"prune: none of the {len(selected)} modules selected by {select!r} has a tensor {name!r}; select "
        "layers that hold weights, e.g. nn.Conv2d, nn.Linear or nn.BatchNorm2d"
    )


def _check_how(how: str, data: Any, loss_func: Any) -> None:
    if how not in HOWS:
        raise ValueError(f"prune: how={how!r} is not one of {', '.join(HOWS)}")
    if how in ("activation", "taylor") and data is None:
        raise ValueError(
            f"prune: how={how!r} measures activations, so it needs data=... (a DataLoader or a list of "
            "batches); or use how='l1', which needs none"
        )
    if how == "taylor" and loss_func is None:
        raise ValueError(
            "prune: how='taylor' needs loss_func=... (e.g. torch.nn.functional.cross_entropy) to take the "
            "gradient of the loss"
        )


def _weight(module: nn.Module, name: str) -> torch.Tensor:
    return getattr(module, name).detach()


def _l1(weight: torch.Tensor, structured: bool, dim: int) -> torch.Tensor:
    if not structured:
        return weight.abs()
    return weight.abs().transpose(0, dim).reshape(weight.shape[dim], -1).sum(1)


def _random(weight: torch.Tensor, structured: bool, dim: int) -> torch.Tensor:
    shape = (weight.shape[dim],) if structured else weight.shape
    return torch.rand(shape, device=weight.device)


def _batches(data: Iterable[Batch], how: str) -> Split:
    return split_batches(data, f"prune how={how!r}")


def _activation_scores(
    model: nn.Module,
    modules: list[tuple[str, nn.Module]],
    batches: Split,
    structured: bool,
    dim: int,
    name: str,
) -> dict[str, torch.Tensor]:
    if structured:
        kind = "input" if dim == 1 else "output"
        return _unit_activation(model, modules, batches, kind)
    inputs = _unit_activation(model, modules, batches, "input")
    return {n: _weight(m, name).abs() * _per_weight(inputs[n], _weight(m, name), n) for n, m in modules}


def _per_weight(unit_scores: torch.Tensor, weight: torch.Tensor, module_name: str) -> torch.Tensor:
    """Input-unit scores broadcast over a weight whose axis 1 reads those units (1-D weights: axis 0)."""
    axis = 1 if weight.dim() > 1 else 0
    if weight.shape[axis] != unit_scores.numel():
        raise ValueError(
            f"prune: how='activation' on {module_name!r}: its weight reads {weight.shape[axis]} input units "
            f"but its input has {unit_scores.numel()} (grouped convolution?); use structured=True or how='l1'"
        )
    shape = [1] * weight.dim()
    shape[axis] = -1
    return unit_scores.reshape(shape)


def _unit_activation(
    model: nn.Module,
    modules: list[tuple[str, nn.Module]],
    batches: Split,
    kind: str,
) -> dict[str, torch.Tensor]:
    """Mean ``|x|`` per unit of each module's output (or first input) over every call on ``batches``."""
    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, int] = {}

    def record(module_name: str, module: nn.Module, value: Any) -> None:
        tensor = first_tensor(value).detach()
        per_unit = _per_unit_sum(tensor.abs(), unit_axis(module))
        sums[module_name] = sums.get(module_name, 0) + per_unit
        counts[module_name] = counts.get(module_name, 0) + tensor.numel() // per_unit.numel()

    with HookSet() as hooks, evaluating(model), torch.no_grad():
        _on_units(hooks, modules, kind, record)
        for inputs, _ in batches:
            model(*inputs)
    _require_ran(modules, sums)
    return {n: sums[n] / counts[n] for n, _ in modules}


def _taylor_scores(
    model: nn.Module,
    modules: list[tuple[str, nn.Module]],
    batches: Split,
    loss_func: Callable[..., torch.Tensor],
    structured: bool,
    dim: int,
    name: str,
) -> dict[str, torch.Tensor]:
    if not structured:
        grads = _weight_grads(model, modules, batches, loss_func, name)
        return {n: (_weight(m, name) * grads[n]).abs() for n, m in modules}
    kind = "input" if dim == 1 else "output"
    sums: dict[str, torch.Tensor] = {}
    samples: dict[str, int] = {}

    def watch(module_name: str, module: nn.Module, value: Any) -> None:
        tensor = first_tensor(value)
        if tensor is None or not tensor.requires_grad:
            return
        activation = tensor.detach().clone()  # an in-place op later in the forward must not change it

        def on_grad(grad: torch.Tensor) -> None:
            per_sample = _per_sample_unit_sum(activation * grad, unit_axis(module)).abs()
            sums[module_name] = sums.get(module_name, 0) + per_sample.sum(0)
            samples[module_name] = samples.get(module_name, 0) + per_sample.shape[0]

        hooks.tensor(tensor, on_grad)

    params = [p for p in model.parameters() if p.requires_grad]
    with HookSet() as hooks, evaluating(model), torch.enable_grad():  # also when called under no_grad
        _on_units(hooks, modules, kind, watch)
        for inputs, targets in batches:
            loss = _loss(model, inputs, targets, loss_func)
            torch.autograd.grad(loss, params, allow_unused=True)
    _require_ran(modules, sums)
    return {n: sums[n] / samples[n] for n, _ in modules}


def _on_units(
    hooks: HookSet, modules: list[tuple[str, nn.Module]], kind: str, fn: Callable[[str, nn.Module, Any], None]
) -> None:
    """Call ``fn(name, module, value)`` with each module's inputs (``kind="input"``) or output, per call."""
    for n, m in modules:
        if kind == "input":
            hooks.forward_pre(m, lambda mod, args, n=n: fn(n, mod, args))
        else:
            hooks.forward(m, lambda mod, args, out, n=n: fn(n, mod, out))


def _weight_grads(
    model: nn.Module,
    modules: list[tuple[str, nn.Module]],
    batches: Split,
    loss_func: Callable[..., torch.Tensor],
    name: str,
) -> dict[str, torch.Tensor]:
    """``dL/dw`` of each module's effective weight, summed over ``batches`` (``.grad`` left untouched)."""
    totals: dict[str, torch.Tensor] = {n: torch.zeros_like(_weight(m, name)) for n, m in modules}
    with evaluating(model), torch.enable_grad():
        for inputs, targets in batches:
            # a masked weight is recomputed in the forward pre-hook, so it is read after the forward
            loss = _loss(model, inputs, targets, loss_func)
            weights = [getattr(m, name) for _, m in modules]
            grads = torch.autograd.grad(loss, weights, allow_unused=True)
            for (n, _), grad in zip(modules, grads, strict=True):
                if grad is not None:
                    totals[n] += grad
    return totals


def _loss(
    model: nn.Module,
    inputs: tuple[Any, ...],
    targets: tuple[Any, ...],
    loss_func: Callable[..., torch.Tensor],
) -> torch.Tensor:
    if not targets:
        raise ValueError("prune: how='taylor' needs batches with targets, (x, y), to compute the loss")
    return loss_func(model(*inputs), *targets)


def _per_unit_sum(tensor: torch.Tensor, axis: int) -> torch.Tensor:
    return tensor.movedim(axis, 0).reshape(tensor.shape[axis], -1).sum(1)


def _per_sample_unit_sum(tensor: torch.Tensor, axis: int) -> torch.Tensor:
    """``(samples, units)``: summed over every other axis (positions, tokens)."""
    moved = tensor.movedim(axis, -1)
    return moved.reshape(moved.shape[0], -1, moved.shape[-1]).sum(1)


def _require_ran(modules: list[tuple[str, nn.Module]], seen: dict[str, Any]) -> None:
    silent = [n for n, _ in modules if n not in seen]
    if silent:
        raise ValueError(
            f"prune: modules {silent[:3]} never ran (or got no gradient) on the data; select modules that "
            "the forward uses"
        )
