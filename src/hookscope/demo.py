"""The train job behind ``hookscope train`` and ``make demo``: data, model, Learner, doctor, run folder.

With the defaults it trains :func:`hookscope.models.digits_cnn` on scikit-learn's bundled digits with a
one-cycle schedule, the doctor and activation / gradient statistics on, and writes everything a run
folder holds (see :mod:`hookscope.run_folder`) — in well under a minute on a laptop CPU.
"""

from __future__ import annotations

import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

import hookscope
from hookscope.run_folder import RunFolder, atomic_write_json


@dataclass
class TrainOptions:
    """Every option of ``hookscope train``; written to ``config.json`` and read back by ``--resume``."""

    model: str = "hookscope.models:digits_cnn"
    data: str = "digits"
    epochs: int = 5
    lr: float = 3e-3
    batch_size: int = 64
    precision: str = "32"
    clip: float | None = None
    seed: int = 0
    doctor: bool = True
    weights: str | None = None
    image_size: int = 64
    device: str | None = None
    out: str | None = None


DEFAULTS = TrainOptions()
OPTION_NAMES = tuple(f.name for f in fields(TrainOptions))


@dataclass
class TrainResult:
    """What a finished run hands back to the command: the learner and the findings, most severe first."""

    learn: Any
    findings: list[dict[str, Any]]
    duration_s: float


def write_config(folder: RunFolder, options: TrainOptions, argv: Sequence[str], **extra: Any) -> Path:
    """``config.json``: the options, the command line, library versions and ``extra`` (times, results)."""
    config = {
        "name": folder.final.name,
        "command": " ".join(["hookscope", *argv[1:]]),
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


def _argv() -> list[str]:
    return list(sys.argv)


def _elapsed(start: float) -> float:
    return time.perf_counter() - start
