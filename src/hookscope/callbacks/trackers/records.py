"""What the trackers log, as plain values: the same rows reach TensorBoard, W&B and MLflow.

Nothing here knows a tracker library. The statistics come from the on-device
:class:`~hookscope.callbacks.ActivationStats` / :class:`~hookscope.callbacks.GradientStats` histories
(read in their own bulk transfers), named so a dashboard groups them by statistic, one chart per layer:
``activation_mean/<layer>``, ``activation_std/<layer>``, ``dead_units/<layer>``, ``grad_std/<layer>``
(the gradient flowing out of a layer), ``grad_norm/<module>`` and ``update_ratio/<module>`` (parameters
summed per module, not one chart per parameter).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from hookscope.doctor.findings import ranked
from hookscope.doctor.record_types import ParamRecord, StepStats
from hookscope.hooks.batch import split_batch
from hookscope.hooks.stats import TensorStats
from hookscope.hooks.tensors import map_tensors

Rows = dict[int, dict[str, float]]  # step -> {key: value}


class Stepped(Protocol):
    step: int


@dataclass(frozen=True)
class Predictions:
    """Sample predictions on the first validation batch: a table, and the inputs when they are images.

    ``images`` is ``(rows, height, width, channels)`` in [0, 1] (each image scaled to its own range), or
    None when the inputs are not images.
    """

    columns: list[str]
    rows: list[list[Any]]
    images: np.ndarray | None


def add_row(rows: Rows, step: int, values: Mapping[str, float]) -> None:
    """Merge ``values`` into the row of ``step`` (one write per step per tracker)."""
    rows.setdefault(step, {}).update(values)


def since(records: Sequence[Stepped], after: int | None) -> Sequence[Stepped]:
    """The records newer than step ``after`` (all of them when None); records are ordered by step."""
    if after is None:
        return records
    start = len(records)
    while start and records[start - 1].step > after:
        start -= 1
    return records[start:]


def spaced(steps: Iterable[int], last: int | None, spacing: int) -> list[int]:
    """The steps to log, in order: each at least ``spacing`` after the one before (and after ``last``)."""
    chosen = []
    for step in sorted(set(steps)):
        if last is None or step >= last + spacing:
            chosen.append(step)
            last = step
    return chosen


def activation_values(stats: TensorStats) -> dict[str, float]:
    """The per-layer activation scalars: mean, standard deviation and the share of dead units."""
    return {"activation_mean": stats.mean, "activation_std": stats.std, "dead_units": stats.dead_fraction()}


def module_gradients(records: Mapping[str, ParamRecord]) -> dict[str, float]:
    """Per module: ``grad_norm/<module>`` (the L2 norm over its parameters' gradients) and
    ``update_ratio/<module>`` (that of its ``weight``, else its largest ratio), from one step's records."""
    squares: dict[str, float] = {}
    ratios: dict[str, tuple[bool, float]] = {}
    for name, record in records.items():
        module, _, param = name.rpartition(".")
        module = module or name
        if record.grad_norm is not None:
            squares[module] = squares.get(module, 0.0) + record.grad_norm**2
        if record.update_ratio is None:
            continue
        is_weight = param == "weight"
        best = ratios.get(module)
        if best is None or (is_weight, record.update_ratio) > best:
            ratios[module] = (is_weight, record.update_ratio)
    values = {f"grad_norm/{module}": math.sqrt(total) for module, total in squares.items()}
    values.update({f"update_ratio/{module}": ratio for module, (_, ratio) in ratios.items()})
    return values


def at_steps(history: Mapping[str, Sequence[StepStats]], steps: set[int]) -> Iterable[tuple[str, StepStats]]:
    """``(layer, record)`` for every record of ``history`` taken at one of ``steps``."""
    for layer, records in history.items():
        for record in records:
            if record.step in steps:
                yield layer, record


def learner_config(learn: Any, extra: Mapping[str, Any]) -> dict[str, Any]:
    """The run's configuration: the Learner's facts and hyperparameters, then ``extra`` (options the
    user or the run folder named)."""
    from hookscope.callbacks.run_folder import learner_facts

    config = learner_facts(learn)
    config["parameters"] = sum(p.numel() for p in learn.model.parameters())
    config["trainable_parameters"] = sum(p.numel() for p in learn.model.parameters() if p.requires_grad)
    if learn.opt is not None:
        hypers = {k: v for k, v in learn.opt.param_groups[0].items() if k != "params"}
        config["optimizer"] = {k: v for k, v in hypers.items() if isinstance(v, int | float | str | bool)}
    config.update(extra)
    return config


def flat_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """``config`` as one level of ``a.b`` keys with string values (MLflow params, TensorBoard hparams)."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flat_config(value, f"{name}."))
        else:
            flat[name] = str(value)
    return flat


def dataset_description(learn: Any) -> dict[str, Any]:
    """Sizes and shapes of the training and validation data, from the loaders and one training batch."""
    train, valid = learn.dls.train, learn.dls.valid
    xb, yb = split_batch(learn.one_batch())
    description: dict[str, Any] = {
        "dataset": type(getattr(train, "dataset", train)).__name__,
        "train_samples": _samples(train),
        "valid_samples": _samples(valid) if valid is not None else 0,
        "batch_size": getattr(train, "batch_size", None),
        "train_batches": len(train),
        "valid_batches": len(valid) if valid is not None else 0,
    }
    for role, items in (("input", xb), ("target", yb)):
        if items and isinstance(items[0], torch.Tensor):
            description[f"{role}_shape"] = list(items[0].shape[1:])
            description[f"{role}_dtype"] = str(items[0].dtype).removeprefix("torch.")
    classes = _classes(getattr(train, "dataset", None))
    if classes is not None:
        description["classes"] = classes
    return description


def sample_predictions(learn: Any, n: int) -> Predictions | None:
    """The model's predictions on the first ``n`` samples of the first validation batch (None without
    validation data). Classification (integer targets, one output per class) gives the predicted class
    and its probability; anything else the raw outputs."""
    if learn.dls.valid is None:
        return None
    xb, yb = split_batch(learn.one_batch(learn.dls.valid))
    xb = map_tensors(lambda t: t[:n], xb)
    pred = learn.predict(xb)
    if not isinstance(pred, torch.Tensor):
        return None
    target = yb[0][:n] if yb and isinstance(yb[0], torch.Tensor) else None
    images = _as_images(xb[0]) if isinstance(xb[0], torch.Tensor) else None
    if pred.dim() == 2 and pred.shape[1] > 1 and (target is None or not target.is_floating_point()):
        probs = pred.float().softmax(dim=1)
        confidence, predicted = probs.max(dim=1)
        columns = ["sample", "target", "prediction", "probability"]
        values = [_plain(target), predicted.tolist(), confidence.tolist()]
    else:
        columns = ["sample", "target", "prediction"]
        values = [_plain(target), _plain(pred)]
    rows = [[i, *(column[i] if column is not None else None for column in values)] for i in range(len(pred))]
    return Predictions(columns, rows, images)


def predictions_markdown(table: Predictions) -> str:
    """The predictions table in Markdown (TensorBoard's text panel, notes)."""
    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in table.rows]
    return "\n".join(lines)


def findings_markdown(findings: Iterable[Any]) -> str:
    """Findings as Markdown lines: severity, kind, module, step and the message; each cause first, the
    symptoms it explains as indented items under it (:func:`~hookscope.doctor.findings.ranked`)."""
    findings = ranked(findings)
    explained = {key for f in findings for key in f.explains}
    return "\n".join(
        ("  " if f.key in explained else "")
        + f"- **{f.severity}** `{f.kind}` in `{f.module or '(model)'}` at step {f.step}: {f.message}"
        for f in findings
    )


def as_uint8(image: np.ndarray) -> np.ndarray:
    """An ``(h, w, c)`` image in [0, 1] as uint8 pixels; a single channel as ``(h, w)`` (grey)."""
    pixels = np.clip(np.rint(image * 255.0), 0, 255).astype(np.uint8)
    return pixels[..., 0] if pixels.shape[-1] == 1 else pixels


def _samples(dl: Any) -> int:
    """Samples a loader yields per pass: its dataset's length, else batches times batch size."""
    dataset = getattr(dl, "dataset", None)
    try:
        return len(dataset)
    except TypeError:
        return len(dl) * (getattr(dl, "batch_size", None) or 1)


def _classes(dataset: Any) -> int | None:
    """Distinct integer targets of an in-memory TensorDataset (cheap); None for other datasets."""
    tensors = getattr(dataset, "tensors", None)
    if not tensors or tensors[-1].is_floating_point() or tensors[-1].dim() != 1:
        return None
    return int(tensors[-1].unique().numel())


def _as_images(x: torch.Tensor) -> np.ndarray | None:
    """``(n, h, w, c)`` in [0, 1] when ``x`` is a batch of 1- or 3-channel images, else None."""
    if x.dim() != 4 or x.shape[1] not in (1, 3) or not x.is_floating_point():
        return None
    flat = x.detach().float().cpu().flatten(1)
    low, high = flat.min(1, keepdim=True).values, flat.max(1, keepdim=True).values
    scaled = ((flat - low) / (high - low).clamp_min(1e-12)).view_as(x)
    return scaled.permute(0, 2, 3, 1).numpy()


def _plain(t: torch.Tensor | None) -> list[Any] | None:
    """One plain value (a number, or a list for a multi-output row) per sample."""
    if t is None:
        return None
    values = t.detach().float().cpu() if t.is_floating_point() else t.detach().cpu()
    return [row if not isinstance(row, list) or len(row) != 1 else row[0] for row in values.tolist()]


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return "[" + ", ".join(_cell(v) for v in value) + "]"
    return str(value)
