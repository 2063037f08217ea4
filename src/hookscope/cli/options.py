"""The options of ``hookscope train`` and their defaults, without torch (the parser's help texts read them).

:mod:`hookscope.cli.train` runs the job with these options; they are written to ``config.json`` and read back
by ``--resume``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


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
    preflight: bool = False  # hs.preflight's checks before training
    profile: bool = False  # the doctor's slow_layers: a profiled window of 5 steps after the warm-up
    weights: str | None = None
    image_size: int = 64
    device: str | None = None
    out: str | None = None
    log: str | None = None  # trackers, comma separated: tensorboard,wandb,mlflow


TRACKERS = ("tensorboard", "wandb", "mlflow")


def tracker_names(text: str | None) -> list[str]:
    """The trackers ``--log`` names, in order: ``"tensorboard, wandb"`` -> ``["tensorboard", "wandb"]``;
    a ValueError names an unknown one."""
    names = [name.strip().lower() for name in (text or "").split(",") if name.strip()]
    unknown = [name for name in names if name not in TRACKERS]
    if unknown:
        raise ValueError(
            f"--log {text}: unknown tracker {', '.join(unknown)}; choose from {', '.join(TRACKERS)}"
        )
    return list(dict.fromkeys(names))


DEFAULTS = TrainOptions()
OPTION_NAMES = tuple(f.name for f in fields(TrainOptions))
