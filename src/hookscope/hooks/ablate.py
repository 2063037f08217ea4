"""ablate(): switch off each selected layer (or each unit of one layer) in turn and measure what it cost.

"Which layer works and which does not", in numbers: the metric on ``data`` with every module intact (the
baseline), then with one module's output replaced through :func:`~hookscope.hooks.patch.patch` by zeros
(``how="zero"``) or by its mean over ``data`` (``how="mean"``, which keeps the layer's average signal and
removes only what varies with the input). ``per="unit"`` ablates each channel or feature of one module
instead. The table is sorted by the size of the effect (metric ablated minus baseline).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from hookscope._deprecation import renamed_keywords
from hookscope.hooks.batch import split_batch
from hookscope.hooks.handles import HookSet
from hookscope.hooks.patch import patch
from hookscope.hooks.select import Spec
from hookscope.hooks.select import select as select_modules
from hookscope.hooks.tensors import first_tensor

Batch = Any  # a tensor (input only) or a tuple/list ``(*inputs, target)``
Split = list[tuple[tuple[Any, ...], tuple[Any, ...]]]


@dataclass(frozen=True)
class AblationRow:
    """The metric with module ``name`` (its unit ``unit`` when ablating per unit) switched off, and
    ``effect``: that metric minus the baseline."""

    name: str
    unit: int | None
    metric: float
    effect: float


@dataclass
class Ablation:
    """What :func:`ablate` measured: the ``baseline`` metric and one row per ablation, largest
    ``|effect|`` first. Prints as a table; ``hs.viz.ablation_effects`` draws it."""

    baseline: float
    how: str
    per: str
    metric_name: str
    rows: list[AblationRow] = field(default_factory=list)

    def effect(self, name: str, unit: int | None = None) -> float:
        """The effect of ablating ``name`` (its ``unit`` when ablated per unit)."""
        for row in self.rows:
            if row.name == name and row.unit == unit:
                return row.effect
        raise KeyError(f"ablation: no row for {name!r}" + (f" unit {unit}" if unit is not None else ""))

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON."""
        rows = [vars(row) for row in self.rows]
        return {
            "baseline": self.baseline,
            "how": self.how,
            "per": self.per,
            "metric": self.metric_name,
            "rows": rows,
        }

    def __str__(self) -> str:
        label = "unit" if self.per == "unit" else "layer"
        lines = [
            f"ablation ({self.how}, per {self.per}): baseline {self.metric_name} = {self.baseline:.4f}",
            f"{label:<32} {self.metric_name:>12} {'effect':>12}",
        ]
        for row in self.rows:
            who = f"{row.name}[{row.unit}]" if row.unit is not None else row.name
            lines.append(f"{who:<32} {row.metric:>12.4f} {row.effect:>+12.4f}")
        return "\n".join(lines)


@renamed_keywords(spec="select")
def ablate(
    model: nn.Module,
    select: Spec,
    data: Iterable[Batch],
    metric: Callable[..., Any] | None = None,
    how: str = "zero",
    per: str = "layer",
) -> Ablation:
    """Switch off each module selected by ``select`` in turn (``per="unit"``: each unit of the one
    module ``select`` selects) and return the :class:`Ablation` table of ``metric(pred, target)`` over
    ``data``.

    ``metric`` defaults to the cross-entropy loss; any function returning a number or a scalar tensor
    (accuracy, a loss) works and is averaged over the batches weighted by their size. The model runs in
    eval mode without gradients; its modes come back afterwards.
    """
    if how not in ("zero", "mean"):
        raise ValueError(f"ablate: how={how!r}; use 'zero' (outputs set to 0) or 'mean' (set to their mean)")
    if per not in ("layer", "unit"):
        raise ValueError(
            f"ablate: per={per!r}; use 'layer' (each module) or 'unit' (each unit of one module)"
        )
    modules = select_modules(model, select)
    if per == "unit" and len(modules) != 1:
        names = ", ".join(n for n, _ in modules[:4])
        raise ValueError(
            f"ablate: per='unit' ablates the units of one module, but {select!r} selects {len(modules)} "
            f"({names}...); pass one module's name"
        )
    batches = split_batches(data, "ablate")
    score = metric or F.cross_entropy
    with evaluating(model), torch.no_grad():
        means = _means(model, modules, batches, per) if how == "mean" else {}
        baseline = _evaluate(model, batches, score, {})
        rows = [
            AblationRow(name, unit, value, value - baseline)
            for name, unit, value in _ablated(model, modules, batches, score, means, per)
        ]
    rows.sort(key=lambda row: -abs(row.effect))
    return Ablation(baseline, how, per, getattr(score, "__name__", type(score).__name__), rows)


def unit_axis(module: nn.Module) -> int:
    """The axis of a module's output (or input) that indexes its units: features last for ``nn.Linear``,
    channels at axis 1 for convolutions and normalisations."""
    return -1 if isinstance(module, nn.Linear) else 1


def split_batches(data: Iterable[Batch], who: str) -> Split:
    """Each batch of ``data`` as ``(inputs, targets)``: :func:`~hookscope.hooks.batch.split_batch`."""
    split = [split_batch(batch) for batch in data]
    if not split:
        raise ValueError(f"{who}: data holds no batch; pass a DataLoader or a list of (x, y) batches")
    return split


@contextmanager
def evaluating(model: nn.Module) -> Iterator[None]:
    """Eval mode for a block (BatchNorm statistics and dropout untouched); every module's mode comes back."""
    modes = {m: m.training for m in model.modules()}
    model.eval()
    try:
        yield
    finally:
        for module, training in modes.items():
            module.training = training


def _ablated(
    model: nn.Module,
    modules: list[tuple[str, nn.Module]],
    batches: Split,
    score: Callable[..., Any],
    means: dict[str, torch.Tensor],
    per: str,
) -> Iterator[tuple[str, int | None, float]]:
    if per == "layer":
        for name, _ in modules:
            fill = means.get(name)
            yield name, None, _evaluate(model, batches, score, {name: _layer_off(fill)})
        return
    name, module = modules[0]
    axis = unit_axis(module)
    for unit in range(_n_units(model, module, batches, axis)):
        fill = means[name][unit] if means else None
        yield name, unit, _evaluate(model, batches, score, {name: _unit_off(unit, axis, fill)})


def _layer_off(fill: torch.Tensor | None) -> Callable[..., torch.Tensor]:
    def off(output: Any, module: nn.Module, name: str) -> torch.Tensor:
        tensor = _single_tensor(output, name)
        return torch.zeros_like(tensor) if fill is None else fill.expand_as(tensor).clone()

    return off


def _unit_off(unit: int, axis: int, fill: torch.Tensor | None) -> Callable[..., torch.Tensor]:
    def off(output: Any, module: nn.Module, name: str) -> torch.Tensor:
        tensor = _single_tensor(output, name).clone()
        tensor.select(axis, unit).fill_(0.0 if fill is None else float(fill))
        return tensor

    return off


def _single_tensor(output: Any, name: str) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    raise TypeError(
        f"ablate: module {name!r} returns a {type(output).__name__}, not a tensor; select the module inside "
        "it that produces the tensor, or ablate it with hs.patch and a function of your own"
    )


def _evaluate(model: nn.Module, batches: Split, score: Callable[..., Any], patches: dict[str, Any]) -> float:
    """``score`` averaged over ``batches`` (weighted by batch size), with ``patches`` applied."""
    total, count = torch.zeros(()), 0
    with patch(model, patches) if patches else _nothing():
        for inputs, targets in batches:
            if not targets:
                raise ValueError(
                    "ablate: the batches have no targets; pass (x, y) batches so the metric has a y"
                )
            n = len(targets[0])
            total = total + torch.as_tensor(score(model(*inputs), *targets), dtype=torch.float64).cpu() * n
            count += n
    return float(total / count)


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def _means(
    model: nn.Module, modules: list[tuple[str, nn.Module]], batches: Split, per: str
) -> dict[str, torch.Tensor]:
    """Mean output of each module over ``batches``: per element (batch axis averaged) for ``per="layer"``,
    per unit for ``per="unit"``."""
    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, int] = {}

    def record(name: str, module: nn.Module, output: Any) -> None:
        tensor = _single_tensor(output, name).detach()
        if per == "unit":
            axis = unit_axis(module) % tensor.dim()
            part = tensor.movedim(axis, 0).reshape(tensor.shape[axis], -1)
            sums[name], counts[name] = sums.get(name, 0) + part.sum(1), counts.get(name, 0) + part.shape[1]
        else:
            sums[name], counts[name] = (
                sums.get(name, 0) + tensor.sum(0),
                counts.get(name, 0) + tensor.shape[0],
            )

    with HookSet() as hooks:
        for name, module in modules:
            hooks.forward(module, lambda m, args, out, name=name: record(name, m, out))
        for inputs, _ in batches:
            model(*inputs)
    return {name: sums[name] / counts[name] for name in sums}


def _n_units(model: nn.Module, module: nn.Module, batches: Split, axis: int) -> int:
    """How many units the module's output has along ``axis``, from one forward of the first batch."""
    seen: list[int] = []
    with HookSet() as hooks:
        hooks.forward(module, lambda m, args, out: seen.append(first_tensor(out).shape[axis]))
        model(*batches[0][0])
    return seen[0]
