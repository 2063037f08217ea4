"""Two run folders side by side: what differs in their config, metrics, per-layer statistics and findings.

Everything is read from the folders (``config.json``, ``metrics.jsonl``, ``findings.json`` and the doctor's
per-layer history in ``history.json``: each layer's activation mean and std, its parameters' gradient norm
and largest update ratio, at most 500 records per series), so two runs can be compared at any time after
they ended. A folder written before ``history.json`` existed is read from the doctor's history kept in
``checkpoints/last.pt`` (up to 128 records per layer), put in the same layout. :func:`hookscope.compare_runs`
draws the page from this.

**Where two runs part.** Each per-layer series (one statistic of one layer, e.g. the std of ``features.3``'s
activations) is compared at the steps both runs recorded. A series jumps from one record to the next even
within one run — that is its *noise*, measured honestly from the runs themselves: the median absolute change
between consecutive records, the larger of the two runs'. The series part at the first step where the runs
differ by more than :data:`NOISE_MULTIPLE` times that noise; the runs part at the earliest such step of any
series (ties go to the layer that runs first). Runs that differ nowhere by more than that (the same seed on
the same machine gives exact equality) have not parted.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hookscope.doctor.history_codec import history_from_state, params_from_state
from hookscope.run_history import layer_history, read_history
from hookscope.run_reader import read_metrics
from hookscope.staged_folder import CONFIG, RunFolderError, read_json
from hookscope.train.checkpoint.file import CheckpointError, load_checkpoint

NOISE_MULTIPLE = 3.0
# config.json entries that differ between any two runs (identity, times, paths), left out of the differences
UNCOMPARED = ("name", "command", "commands", "started", "ended", "duration_s", "status", "options.out")
# the activation statistics compared per layer, as the page names them
ACTIVATION_STATS = ("mean", "std")
# kind label of the per-layer gradient series -> its column in history.json's "gradients"
GRADIENT_KINDS = {"gradient norm": "norm", "update ratio": "ratio"}


@dataclass(frozen=True)
class Series:
    """One statistic of one layer (or parameter) over the recorded steps of one run."""

    steps: list[int]
    values: list[float]


@dataclass(frozen=True)
class Parting:
    """Where one series of the two runs first differs beyond noise: ``step``, both values and the noise."""

    kind: str  # "activations", "gradient norm" or "update ratio"
    layer: str
    stat: str
    step: int
    a: float
    b: float
    noise: float

    @property
    def label(self) -> str:
        """``activations std of features.3`` -style words."""
        return f"{self.kind} {self.stat} of `{self.layer}`" if self.stat else f"{self.kind} of `{self.layer}`"


@dataclass
class RunData:
    """What one run folder holds for the comparison."""

    path: Path
    config: dict[str, Any]
    metrics: list[dict[str, Any]]
    findings: list[dict[str, Any]] | None
    # kind -> (layer, stat) -> Series, layers in model order; empty without the doctor's history
    layers: dict[str, dict[tuple[str, str], Series]] = field(default_factory=dict)
    layers_note: str = ""  # why there are no per-layer statistics, when there are none

    @property
    def name(self) -> str:
        return str(self.config.get("name") or self.path.name)


@dataclass(repr=False)
class RunComparison:
    """Two runs side by side (see the module docstring): ``config_diff`` rows ``(key, a, b)``, each run's
    data, every series' :class:`Parting` (``partings``, earliest first) and ``first`` of them (None: the runs
    have not parted beyond noise). ``page`` is the written ``compare.html``, once written."""

    a: RunData
    b: RunData
    config_diff: list[tuple[str, Any, Any]]
    partings: list[Parting]
    compared_series: int
    page: Path | None = None

    @property
    def first(self) -> Parting | None:
        """The earliest parting of all series (ties: the layer that runs first)."""
        return self.partings[0] if self.partings else None

    @property
    def identical(self) -> bool:
        """Same config (beyond names and times), same metrics, and no per-layer series parted."""
        return not self.config_diff and not self.partings and self.metrics_differ() is None

    def metrics_differ(self) -> str | None:
        """The first metric value that differs between the runs (``"valid_loss at epoch 0"``), or None."""
        rows_b = {_row_key(row): row for row in self.b.metrics}
        for row in self.a.metrics:
            other = rows_b.get(_row_key(row))
            for key, value in row.items():
                if key == "time" or other is None:
                    continue
                if other.get(key) != value:
                    return f"{key} at {row.get('kind', 'row')} {row.get('step') or row.get('epoch')}"
        return None if len(self.a.metrics) == len(self.b.metrics) else "the number of metric rows"

    def verdict(self) -> str:
        """Where the runs part, in one paragraph."""
        a, b = f"`{self.a.name}`", f"`{self.b.name}`"
        config = (
            f"Their configs differ in {', '.join(k for k, _, _ in self.config_diff[:6])}"
            + (" and more" if len(self.config_diff) > 6 else "")
            + ". "
            if self.config_diff
            else "Their configs are the same (beyond names, paths and times). "
        )
        if self.identical:
            same = "Metrics and per-layer statistics are equal."
            return f"Runs {a} and {b} are identical: {config.strip()} {same}"
        first = self.first
        if first is None:
            layers = self.a.layers_note or self.b.layers_note
            where = (
                f"no per-layer statistics could be compared ({layers})"
                if layers
                else f"none of the {self.compared_series} per-layer series parts beyond its noise"
            )
            metric = self.metrics_differ()
            metrics = f"their metrics differ ({metric}), but {where}" if metric else where
            return f"Runs {a} and {b}: {config}{metrics[0].upper()}{metrics[1:]}."
        return (
            f"Runs {a} and {b} part at step {first.step}, in the {first.label}: {_num(first.a)} against "
            f"{_num(first.b)}, {abs(first.a - first.b) / first.noise:.1f} times the step-to-step noise "
            f"({_num(first.noise)}). {config}{len(self.partings)} of the {self.compared_series} per-layer "
            "series part beyond noise."
        )

    def __str__(self) -> str:
        return self.verdict()

    def __repr__(self) -> str:
        return f"RunComparison({self.a.name!r} vs {self.b.name!r}, first={self.first!r})"


def read_run(path: str | Path) -> RunData:
    """The files of run folder ``path`` that a comparison reads; a folder without config.json is refused."""
    path = Path(path)
    if not (path / CONFIG).is_file():
        raise RunFolderError(
            f"{path} is not a hookscope run folder (no {CONFIG}); give a folder written by hookscope train "
            "or hs.callbacks.RunFolder"
        )
    findings = read_json(path / "findings.json") if (path / "findings.json").is_file() else None
    data = RunData(path, read_json(path / CONFIG), read_metrics(path), findings)
    data.layers, data.layers_note = _layer_series(path)
    return data


def diff_runs(a: RunData, b: RunData) -> RunComparison:
    """Compare two runs read by :func:`read_run`."""
    partings, compared = [], 0
    for kind, series_a in a.layers.items():
        series_b = b.layers.get(kind, {})
        for key, one in series_a.items():
            other = series_b.get(key)
            if other is None:
                continue
            compared += 1
            parting = _parting(kind, key, one, other)
            if parting is not None:
                partings.append(parting)
    order = {layer: i for i, layer in enumerate(dict.fromkeys(p.layer for p in partings))}
    partings.sort(key=lambda p: (p.step, order[p.layer]))
    return RunComparison(a, b, config_diff(a.config, b.config), partings, compared)


def config_diff(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(dotted key, value in a, value in b)`` per config entry that differs (see :data:`UNCOMPARED`)."""
    flat_a, flat_b = _flatten(a), _flatten(b)
    keys = [k for k in dict.fromkeys([*flat_a, *flat_b]) if k not in UNCOMPARED]
    return [(k, flat_a.get(k), flat_b.get(k)) for k in keys if flat_a.get(k) != flat_b.get(k)]


def noise(series: Series) -> float:
    """The median absolute change between consecutive records of one run's series."""
    steps = sorted(abs(b - a) for a, b in itertools.pairwise(series.values) if math.isfinite(b - a))
    return steps[len(steps) // 2] if steps else 0.0


def _parting(kind: str, key: tuple[str, str], a: Series, b: Series) -> Parting | None:
    level = max(noise(a), noise(b))
    values_b = dict(zip(b.steps, b.values, strict=True))
    for step, value in zip(a.steps, a.values, strict=True):
        other = values_b.get(step)
        if other is None or value == other or (math.isnan(value) and math.isnan(other)):
            continue  # NaN in both: the same missing (or broken) record, no parting
        if not (math.isfinite(value) and math.isfinite(other)) or abs(value - other) > NOISE_MULTIPLE * level:
            return Parting(kind, key[0], key[1], step, value, other, level)
    return None


def _layer_series(folder: Path) -> tuple[dict[str, dict[tuple[str, str], Series]], str]:
    """The doctor's per-layer histories of run folder ``folder``, as series per kind, and why there are
    none when there are none: from ``history.json``, else (an older folder) from its last checkpoint."""
    history = read_history(folder)
    if not history:
        history, note = _checkpoint_history(folder / "checkpoints" / "last.pt")
        if note:
            return {}, note
    activations, gradients = history.get("activations") or {}, history.get("gradients") or {}
    kinds = {
        "activations": {
            (layer, stat): Series(columns["step"], columns[stat])
            for layer, columns in activations.items()
            for stat in ACTIVATION_STATS
        }
    }
    for kind, column in GRADIENT_KINDS.items():
        kinds[kind] = {(layer, ""): Series(c["step"], c[column]) for layer, c in gradients.items()}
    kinds = {kind: series for kind, series in kinds.items() if series}
    return kinds, "" if kinds else _NO_DOCTOR


_NO_DOCTOR = "the run had no doctor, which records the per-layer statistics"


def _checkpoint_history(checkpoint: Path) -> tuple[dict[str, Any], str]:
    """The doctor's history kept in ``checkpoint``, in the layout of ``history.json`` (see
    :func:`hookscope.run_history.layer_history`), or why there is none."""
    if not checkpoint.is_file():
        return {}, "the run kept neither history.json nor a checkpoint, where the doctor's history is saved"
    try:
        state = load_checkpoint(checkpoint)
    except CheckpointError as err:
        return {}, str(err)
    doctor = _doctor_state(state)
    if doctor is None:
        return {}, _NO_DOCTOR
    activations, gradients = doctor.get("activations") or {}, doctor.get("gradients") or {}
    history = history_from_state(list(activations.get("layers", [])), activations.get("history") or {})
    return layer_history(history, params_from_state(gradients.get("param_history") or {})), ""


def _doctor_state(state: dict[str, Any]) -> dict[str, Any] | None:
    classes = state.get("callback_classes", {})
    key = next((k for k, cls in classes.items() if cls == "Doctor"), None)
    return state.get("callbacks", {}).get(key) if key is not None else None


def _row_key(row: dict[str, Any]) -> tuple[Any, ...]:
    return row.get("kind"), row.get("epoch"), row.get("step")


def _flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def _num(value: float) -> str:
    return f"{value:.4g}"
