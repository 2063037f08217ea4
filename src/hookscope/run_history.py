"""``history.json`` of a run folder: the curves the interactive report draws, bounded in size.

What the recorders kept over training — the loss and learning rate of every step, each watched layer's
activation mean, std and dead fraction, each layer's gradient norm and update ratio — thinned to at most
:data:`MAX_POINTS` points per series (every n-th record, the last one kept) and rounded to 5 significant
digits, so the file stays small on a long run of a deep model (see docs/report.md for the sizes).
``stats.json`` keeps only the last step; the checkpoint keeps 128 records, and only with checkpoints on.

Layout: ``{"loss": {"step": [...], "value": [...]}, "lr": {...}, "activations": {layer: {"step", "mean",
"std", "dead"}}, "gradients": {layer: {"step", "norm", "ratio"}}}``, layers in model order; a part that
was not recorded is left out.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hookscope.atomic import atomic_write_text
from hookscope.doctor.record_types import ParamRecord, StepStats
from hookscope.doctor.recorders import ActivationRecorder, GradientRecorder

HISTORY = "history.json"
MAX_POINTS = 500


def write_history(
    file: Callable[[str], Path],
    losses: Sequence[float],
    lrs: Sequence[float],
    activations: ActivationRecorder | None,
    gradients: GradientRecorder | None,
) -> None:
    """Write ``history.json`` (compact JSON) from what was recorded."""
    record: dict[str, Any] = {}
    for key, values in (("loss", losses), ("lr", lrs)):
        if len(values):
            record[key] = _columns(range(1, len(values) + 1), {"value": list(values)})
    record |= layer_history(
        activations.history if activations is not None else None,
        gradients.param_history if gradients is not None else None,
    )
    atomic_write_text(file(HISTORY), json.dumps(record, separators=(",", ":")))


def layer_history(
    activations: Mapping[str, Sequence[StepStats]] | None, params: Mapping[str, Sequence[ParamRecord]] | None
) -> dict[str, Any]:
    """The ``activations`` and ``gradients`` parts of ``history.json`` from the recorders' histories (per
    layer; per parameter, gathered by layer), each left out when None: also how a comparison reads a
    checkpoint's history in the same layout."""
    parts: dict[str, Any] = {}
    if activations is not None:
        parts["activations"] = _activations(activations)
    if params is not None:
        parts["gradients"] = _gradients(params)
    return parts


def read_history(folder: Path) -> dict[str, Any]:
    """The ``history.json`` of run folder ``folder`` (empty when the run wrote none)."""
    path = Path(folder) / HISTORY
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def keep(count: int, max_points: int = MAX_POINTS) -> list[int]:
    """The indices kept of ``count`` points: every n-th (n the smallest that fits), the last always."""
    if count <= max_points:
        return list(range(count))
    every = math.ceil((count - 1) / (max_points - 1))
    return [*range(0, count - 1, every), count - 1]


def _activations(history: Mapping[str, Sequence[StepStats]]) -> dict[str, Any]:
    return {
        layer: _columns(
            [r.step for r in records],
            {
                "mean": [r.stats.mean for r in records],
                "std": [r.stats.std for r in records],
                "dead": [r.stats.dead_fraction() for r in records],
            },
        )
        for layer, records in history.items()
        if records
    }


def _gradients(params: Mapping[str, Sequence[ParamRecord]]) -> dict[str, Any]:
    """Per layer (a parameter's module): the norm of its parameters' gradients together
    (``sqrt`` of the sum of squares) and the largest update ratio, per recorded step."""
    layers: dict[str, dict[int, list[ParamRecord]]] = {}
    for name, records in params.items():
        by_step = layers.setdefault(name.rpartition(".")[0] or "(model)", {})
        for r in records:
            by_step.setdefault(r.step, []).append(r)
    out = {}
    for layer, by_step in layers.items():
        steps = sorted(by_step)
        norms = [[r.grad_norm for r in by_step[s] if r.grad_norm is not None] for s in steps]
        ratios = [[r.update_ratio for r in by_step[s] if r.update_ratio is not None] for s in steps]
        out[layer] = _columns(
            steps,
            {
                "norm": [math.sqrt(sum(n * n for n in ns)) if ns else math.nan for ns in norms],
                "ratio": [max(rs) if rs else math.nan for rs in ratios],
            },
        )
    return {layer: columns for layer, columns in out.items() if columns["step"]}


def _columns(steps: Sequence[int], values: dict[str, list[float]]) -> dict[str, list[Any]]:
    kept = keep(len(steps))
    return {"step": [steps[i] for i in kept]} | {
        key: [_round(column[i]) for i in kept] for key, column in values.items()
    }


def _round(value: float) -> float:
    value = float(value)
    return float(f"{value:.5g}") if math.isfinite(value) else value
