"""Experiment trackers: TensorBoard, Weights & Biases and MLflow (re-exported lazily; each tracker's library
is imported only when its callback starts a run)."""

from typing import TYPE_CHECKING

from hookscope._lazy import lazy_exports

if TYPE_CHECKING:
    from hookscope.callbacks.trackers.base import Tracker, TrackerWarning
    from hookscope.callbacks.trackers.mlflow import MLflowCallback
    from hookscope.callbacks.trackers.tensorboard import TensorBoardCallback
    from hookscope.callbacks.trackers.wandb import WandbCallback

__all__ = ["MLflowCallback", "TensorBoardCallback", "Tracker", "TrackerWarning", "WandbCallback"]

_BASE = "hookscope.callbacks.trackers.base"
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "Tracker": _BASE,
        "TrackerWarning": _BASE,
        "MLflowCallback": "hookscope.callbacks.trackers.mlflow",
        "TensorBoardCallback": "hookscope.callbacks.trackers.tensorboard",
        "WandbCallback": "hookscope.callbacks.trackers.wandb",
    },
)
