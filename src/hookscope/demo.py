"""The train job behind ``hookscope train`` and ``make demo``: data, model, Learner, doctor, run folder.

With the defaults it trains :func:`hookscope.models.digits_cnn` on scikit-learn's bundled digits with a
one-cycle schedule, the doctor and activation / gradient statistics on, and writes everything a run
folder holds (see :mod:`hookscope.run_folder`) — in well under a minute on a laptop CPU.
"""

from __future__ import annotations

import platform
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

import hookscope
from hookscope.atomic import atomic_write_json, atomic_write_text
from hookscope.callbacks.checkpoint import Checkpoint
from hookscope.callbacks.clip import GradientClip
from hookscope.callbacks.doctor import Doctor
from hookscope.callbacks.loggers.metrics import MetricsLogger
from hookscope.callbacks.precision import MixedPrecision
from hookscope.callbacks.schedule import OneCycle
from hookscope.cli.options import DEFAULTS, OPTION_NAMES, TrainOptions  # noqa: F401 (also demo.DEFAULTS)
from hookscope.hooks.capture import capture
from hookscope.hooks.summary import Summary
from hookscope.metrics import accuracy
from hookscope.run_folder import RunFolder
from hookscope.specs import SpecError, checked_summary, load_data, load_model
from hookscope.train.callback import Callback
from hookscope.train.learner import Learner
from hookscope.viz.curves import loss_curves, lr_schedule
from hookscope.viz.feature_maps import feature_maps, save_figure
from hookscope.viz.plots import activation_curves, colorful_dimension, gradient_flow
from hookscope.viz.report import REPORT, write_report

SEVERITY_RANK = {"error": 2, "warning": 1, "info": 0}
ACTIVATIONS = (nn.ReLU, nn.LeakyReLU, nn.GELU, nn.SiLU, nn.ELU, nn.Tanh, nn.Sigmoid, nn.ReLU6, nn.Hardswish)
MAX_COLORFUL = 4  # colorful-dimension images in the report: one per layer, the first few watched layers


@dataclass
class TrainResult:
    """What a finished run hands back to the command: the learner and the findings, most severe first."""

    learn: Learner
    findings: list[dict[str, Any]]
    duration_s: float


def run(options: TrainOptions, folder: RunFolder, *, resume: bool = False, command: str = "") -> TrainResult:
    """Train as ``options`` say and write every file of the run into ``folder`` (still partial).

    ``resume=True`` continues from ``folder/checkpoints/last.pt`` to ``options.epochs``.
    Model, data and input problems raise :class:`~hookscope.specs.SpecError` before anything trains.
    """
    start, started = time.perf_counter(), _now()
    torch.manual_seed(options.seed)
    device = _device(options)
    data = load_data(
        options.data, batch_size=options.batch_size, seed=options.seed, image_size=options.image_size
    )
    model = load_model(
        options.model, num_classes=data.num_classes, weights=None if resume else options.weights
    )
    sample = next(iter(data.valid))[0][:1]
    fix = f"use --data whose samples fit {options.model}, or a --model built for them"
    summary = checked_summary(model, options.model, fix, example=sample)
    _write_summary(folder, summary)
    write_config(folder, options, command, started=started, status="running")
    learn = Learner(
        model,
        (data.train, data.valid),
        nn.CrossEntropyLoss(),
        lr=options.lr,
        metrics=[accuracy],
        cbs=train_callbacks(options, folder),
        device=device,
    )
    learn.fit(options.epochs, resume=folder.path if resume else None)
    findings = _findings(learn)
    if options.doctor:
        atomic_write_json(folder.file("findings.json"), findings)
        _write_stats(folder, learn.doctor)
    _write_figures(folder, learn, sample.to(device))
    duration = _elapsed(start)
    write_config(
        folder, options, command, started=started, ended=_now(), duration_s=duration, status="complete"
    )
    write_report(folder.path)
    return TrainResult(learn, findings, duration)


def closing_words(result: TrainResult, run_dir: Path) -> str:
    """What ``hookscope train`` prints at the end: the report's path, the final metrics, the top findings."""
    last = result.learn.recorder.history[-1]
    lines = [
        f"report: {run_dir / REPORT}",
        f"epoch {last['epoch'] + 1}: valid_loss {last['valid_loss']:.4f}, accuracy {last['accuracy']:.4f} "
        f"({result.duration_s:.1f} s)",
    ]
    if not hasattr(result.learn, "doctor"):
        return "\n".join([*lines, "doctor: off (--no-doctor)"])
    if not result.findings:
        return "\n".join([*lines, "doctor: no problem found"])
    lines.append("top findings:")
    lines += [f"  [{f['severity']}] {f['module'] or '(model)'}: {f['message']}" for f in result.findings[:3]]
    return "\n".join(lines)


def _device(options: TrainOptions) -> torch.device:
    device = torch.device(options.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SpecError(f"--device {options.device}: no CUDA device is available here; use --device cpu")
    if options.precision == "fp16" and device.type != "cuda":
        raise SpecError("--precision fp16 needs a CUDA device (it uses a gradient scaler); use bf16 on CPU")
    return device


def train_callbacks(options: TrainOptions, folder: RunFolder) -> list[Callback]:
    """The callbacks ``options`` ask for: one-cycle, metrics, checkpoints, precision, clipping, doctor."""
    cbs: list[Callback] = [
        OneCycle(options.lr),
        MetricsLogger(folder.path, every=10),
        Checkpoint(folder.path / "checkpoints", monitor="valid_loss", sigint=True),
    ]
    if options.precision != "32":
        cbs.append(MixedPrecision(torch.bfloat16 if options.precision == "bf16" else torch.float16))
    if options.clip is not None:
        cbs.append(GradientClip(options.clip))
    if options.doctor:
        cbs.append(Doctor())
    return cbs


def _write_summary(folder: RunFolder, summary: Summary) -> None:
    """``summary.txt`` as printed, ``summary.json`` as the report's table (one row per module call)."""
    atomic_write_text(folder.file("summary.txt"), str(summary))
    rows = [
        {
            "layer": "\u2003" * (row.depth - 1) + row.name,
            "type": row.type,
            "output_shape": ", ".join("×".join(map(str, s)) for s in row.output_shapes),
            "params": row.params,
            "MACs": row.macs,
        }
        for row in summary.rows
        if row.name
    ]
    totals = {k: getattr(summary, k) for k in ("total_params", "trainable_params", "total_macs")}
    atomic_write_json(folder.file("summary.json"), {**totals, "rows": rows})


def _findings(learn: Learner) -> list[dict[str, Any]]:
    """The doctor's findings as plain dicts, most severe first (then by step)."""
    doctor = getattr(learn, "doctor", None)
    if doctor is None:
        return []
    found = sorted(doctor.findings, key=lambda f: (-SEVERITY_RANK.get(f.severity, 0), f.step))
    return [f.to_dict() for f in found]


def _write_stats(folder: RunFolder, doctor: Doctor) -> None:
    """``stats.json``: the last recorded activation statistics of every watched layer."""
    rows = [
        {
            "layer": name,
            "step": record.step,
            "mean": record.stats.mean,
            "std": record.stats.std,
            "dead_units": record.stats.dead_fraction(),
            "non_finite": record.stats.nonfinite,
            "abs_max": record.stats.abs_max,
            "zeros": record.stats.zero_fraction,
            "sampled": record.stats.sampled,
        }
        for name, record in doctor.activations.latest().items()
    ]
    atomic_write_json(folder.file("stats.json"), rows)


def _write_figures(folder: RunFolder, learn: Learner, sample: torch.Tensor) -> None:
    """Every figure of the report: curves, statistics and gradient flow (doctor on), feature maps."""
    recorder = learn.recorder
    save_figure(loss_curves(recorder.losses, recorder.history), folder.file("figures/loss.png"))
    save_figure(lr_schedule(recorder.lrs), folder.file("figures/lr.png"))
    doctor = getattr(learn, "doctor", None)
    if doctor is not None:
        _write_stat_figures(folder, doctor)
    _write_feature_maps(folder, learn.model, sample)


def _write_stat_figures(folder: RunFolder, doctor: Doctor) -> None:
    history = doctor.activations.history
    watched = [name for name, records in history.items() if records]
    if not watched:
        return
    shown = [n for n in watched if n in _activation_layers(doctor.learn.model)] or watched
    save_figure(activation_curves(history, shown[:12]), folder.file("figures/activations.png"))
    for name in shown[:MAX_COLORFUL]:
        save_figure(colorful_dimension(history, name), folder.file(f"figures/colorful_{name}.png"))
    if any(doctor.gradients.param_history.values()):
        save_figure(gradient_flow(doctor.gradients), folder.file("figures/gradient_flow.png"))


def _activation_layers(model: nn.Module) -> set[str]:
    """Names of the nonlinearities: their outputs are where dead or saturated units show."""
    return {name for name, module in model.named_modules() if isinstance(module, ACTIVATIONS)}


def _write_feature_maps(folder: RunFolder, model: nn.Module, sample: torch.Tensor) -> None:
    """Feature maps of the first conv layers on one validation sample (what the model learned to see)."""
    convs = [name for name, module in model.named_modules() if isinstance(module, nn.Conv2d)][:2]
    if not convs:
        return
    model.eval()
    with torch.no_grad(), capture(model, convs) as cap:
        model(sample)
    for name in convs:
        fig = feature_maps(
            cap[name].float().cpu(), max_maps=32, ncols=8, title=f"{name} on a validation sample"
        )
        save_figure(fig, folder.file(f"figures/feature_maps_{name}.png"), dpi=80)


def write_config(folder: RunFolder, options: TrainOptions, command: str, **extra: Any) -> Path:
    """``config.json``: the options, the command line, library versions and ``extra`` (times, results)."""
    config = {
        "name": folder.final.name,
        "command": command,
        "options": asdict(options),
        "versions": versions(),
        **extra,
    }
    return atomic_write_json(folder.file("config.json"), config)


def versions() -> dict[str, str]:
    """Versions of what shapes a run's numbers: Python, hookscope, torch, torchvision, numpy, platform."""
    found = {
        "python": platform.python_version(),
        "hookscope": hookscope.__version__,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "platform": platform.platform(),
    }
    try:
        import torchvision

        found["torchvision"] = torchvision.__version__
    except ImportError:
        found["torchvision"] = "not installed"
    return found


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _elapsed(start: float) -> float:
    return time.perf_counter() - start
