"""``label_problem`` and ``output_loss_mismatch``: targets that cannot teach (one class only, labels out of
range, constant regression targets) and outputs the loss cannot use as they are (an activation the loss
applies again, too few class scores, a bounded output below the targets, shapes the loss broadcasts).

Both read the probe's output and its last module; an error here stops the loss checks, whose figures
would mean nothing."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hookscope.doctor.findings import Finding
from hookscope.doctor.preflight.loss import CLASSIFICATION, REGRESSION
from hookscope.doctor.preflight.probe import Probe, finding

# label_problem "one class only" needs at least this many targets (2 balanced classes: chance 2^-15).
MIN_LABELS_ONE_CLASS = 16
# Output activations whose values are bounded, and the bounds: by module type (nn.Hardtanh and its
# subclass nn.ReLU6 read their own), and by the autograd node of the output (torch.sigmoid in a forward).
_BOUNDED = {
    nn.Sigmoid: (0.0, 1.0),
    nn.Hardsigmoid: (0.0, 1.0),
    nn.Tanh: (-1.0, 1.0),
    nn.Softsign: (-1.0, 1.0),
}
_BOUNDED_OPS = {
    "SigmoidBackward0": (0.0, 1.0),
    "HardsigmoidBackward0": (0.0, 1.0),
    "TanhBackward0": (-1.0, 1.0),
}


def label_problem(
    kind: str, loss_func: Any, targets: list[torch.Tensor], out: torch.Tensor, probe: Probe
) -> list[Finding]:
    """Targets that cannot teach: one class only, labels out of range, regression targets all equal."""
    y = torch.cat([t.detach().reshape(-1).cpu() for t in targets]) if targets else torch.empty(0)
    if y.numel() == 0:
        return []
    if kind in ("multiclass", "nll") and not y.is_floating_point():
        y = y[y != getattr(loss_func, "ignore_index", -100)]
        return _class_labels(y, out, probe)
    if kind in ("multiclass", "nll"):
        if targets[0].shape == out.shape:
            return []  # class probabilities
        return [
            _label_finding(
                "targets are floats but CrossEntropyLoss/NLLLoss needs class indices: use .long()", y
            )
        ]
    if kind in CLASSIFICATION:
        low, high = float(y.min()), float(y.max())
        if low < 0 or high > 1:
            return [_label_finding(f"binary targets reach {low:g} .. {high:g}; they must lie in [0, 1]", y)]
        if len(y) >= MIN_LABELS_ONE_CLASS and low == high:
            return [_label_finding(f"every target is {low:g} in {len(y)} targets seen: one class only", y)]
        return []
    if len(y) >= 2 and float(y.float().std()) == 0:
        return [_label_finding(f"every regression target equals {float(y[0]):g}: nothing to learn", y)]
    return []


def _class_labels(y: torch.Tensor, out: torch.Tensor, probe: Probe) -> list[Finding]:
    if y.numel() == 0:
        return []
    low, high, classes = int(y.min()), int(y.max()), out.shape[1] if out.dim() >= 2 else 1
    if low < 0:
        return [
            _label_finding(f"class labels reach {low}; they must lie in 0 .. C-1 (or be the ignore_index)", y)
        ]
    if high >= classes:
        return [
            finding(
                "output_loss_mismatch",
                probe.last_weighted,
                "error",
                f"`{probe.last_weighted}` outputs {classes} class score(s) but the targets reach class "
                f"{high}: give the last layer {high + 1} (or more) outputs, or remap the labels to "
                f"0 .. {classes - 1}",
                {"output_classes": classes, "max_label": high},
            )
        ]
    if len(y) >= MIN_LABELS_ONE_CLASS and low == high:
        return [_label_finding(f"every label is class {low} in {len(y)} targets seen: one class only", y)]
    seen = int(torch.unique(y).numel())
    if seen == high + 1 and len(y) >= 10 * classes and classes >= 2 * seen:
        return [
            finding(
                "output_loss_mismatch",
                probe.last_weighted,
                "warning",
                f"`{probe.last_weighted}` outputs {classes} class scores but {len(y)} targets use only "
                f"classes 0 .. {high}: give the last layer {seen} outputs",
                {"output_classes": classes, "classes_seen": seen},
            )
        ]
    return []


def _label_finding(problem: str, y: torch.Tensor) -> Finding:
    return finding(
        "label_problem",
        "",
        "error",
        f"{problem}. Check the target column and the label mapping, and shuffle data sorted by class",
        {"targets_seen": len(y), "min": float(y.min()), "max": float(y.max())},
    )


def output_loss_mismatch(kind: str, out: torch.Tensor, target: torch.Tensor, probe: Probe) -> list[Finding]:
    """An output the loss cannot use as it is: its activation applied twice, outside what the loss takes,
    bounded below the targets, or shaped so that the loss broadcasts it."""
    name = probe.last
    if out.shape[0] != target.shape[0]:
        problem = (
            f"the output has {out.shape[0]} rows for {target.shape[0]} targets: a view/reshape lost the "
            "batch dimension; flatten with x.flatten(1), not x.view(-1, ...)"
        )
        return [
            _mismatch(name, problem, {"output_shape": list(out.shape), "target_shape": list(target.shape)})
        ]
    values = out.detach().float()
    rows = values.dim() >= 2 and values.shape[1] >= 2
    sums_to_one = rows and bool(values.min() >= 0) and _close(values.sum(1), 1.0)
    log_probs = rows and bool(values.max() <= 0) and _close(values.logsumexp(1), 0.0)
    if kind == "multiclass" and sums_to_one:
        return [
            _mismatch(
                name,
                "the output is already a softmax (rows sum to 1) and CrossEntropyLoss applies "
                "log_softmax again: return the raw scores (remove the softmax)",
                _range(values),
            )
        ]
    if kind == "nll" and not log_probs:
        fix = "apply log_softmax, not softmax" if sums_to_one else "end the model with log_softmax"
        return [
            _mismatch(
                name,
                f"NLLLoss needs log-probabilities and the output is not: {fix} (or use "
                "CrossEntropyLoss on raw scores)",
                _range(values),
            )
        ]
    if kind == "binary_logits" and _bounded(probe) == (0.0, 1.0):
        return [
            _mismatch(
                name,
                f"the output already went through a sigmoid ({_activation(probe)}) and "
                "BCEWithLogitsLoss applies one again: return the raw scores",
                _range(values),
            )
        ]
    if kind == "binary_probs" and (bool(values.min() < 0) or bool(values.max() > 1)):
        return [
            _mismatch(
                name,
                "BCELoss needs probabilities and the output leaves [0, 1]: use "
                "BCEWithLogitsLoss on the raw scores",
                _range(values),
            )
        ]
    if kind in REGRESSION:
        return _regression_output(values, target, probe)
    return []


def _regression_output(values: torch.Tensor, target: torch.Tensor, probe: Probe) -> list[Finding]:
    name = probe.last
    if values.shape != target.shape and _broadcast(values.shape, target.shape) != target.shape:
        shape = _broadcast(values.shape, target.shape)
        meets = f"broadcast to {tuple(shape)}" if shape else "do not broadcast"
        return [
            _mismatch(
                name,
                f"output {tuple(values.shape)} and targets {tuple(target.shape)} {meets} in the loss: "
                "reshape one to the other's shape (e.g. out.squeeze(1))",
                {"output_shape": list(values.shape), "target_shape": list(target.shape)},
            )
        ]
    bounds = _bounded(probe)
    low, high = float(target.min()), float(target.max())
    if bounds is None or (bounds[0] <= low and high <= bounds[1]):
        return []
    return [
        finding(
            "output_loss_mismatch",
            name,
            "warning",
            f"`{name}` ({_activation(probe)}) bounds the output to "
            f"[{bounds[0]:g}, {bounds[1]:g}] but the targets reach [{low:.3g}, {high:.3g}]: remove it, or "
            "scale the targets into its range",
            {"output_bounds": list(bounds), "target_min": low, "target_max": high},
        )
    ]


def _bounded(probe: Probe) -> tuple[float, float] | None:
    """The bounds of the model's output when a bounded activation made it: its last module (when nothing
    was applied after it), or the operation that made the output."""
    module = probe.last_module if probe.last_is_output else None
    if isinstance(module, nn.Hardtanh):
        return float(module.min_val), float(module.max_val)
    by_module = next((b for t, b in _BOUNDED.items() if isinstance(module, t)), None)
    return by_module or _BOUNDED_OPS.get(probe.final_op)


def _activation(probe: Probe) -> str:
    """What made the output, in words: the last module's type, or the operation."""
    if probe.last_is_output:
        return type(probe.last_module).__name__
    return probe.final_op.removesuffix("Backward0").lower() or "an activation"


def _mismatch(name: str, problem: str, evidence: dict[str, Any]) -> Finding:
    where = f"`{name}`: " if name else ""
    return finding("output_loss_mismatch", name, "error", where + problem, evidence)


def _broadcast(a: torch.Size, b: torch.Size) -> torch.Size | None:
    """The shape ``a`` and ``b`` broadcast to, or None when they do not."""
    try:
        return torch.broadcast_shapes(a, b)
    except RuntimeError:
        return None


def _close(values: torch.Tensor, expected: float) -> bool:
    return bool(torch.allclose(values, torch.full_like(values, expected), atol=1e-3))


def _range(values: torch.Tensor) -> dict[str, float]:
    return {"output_min": float(values.min()), "output_max": float(values.max())}
