"""Built-in callbacks, one file per family (re-exported lazily: each imports its module when first used).

The Recorder lives beside the loop (``hookscope.train.recorder``) and is listed here with the others.
"""

from typing import TYPE_CHECKING

from hookscope._lazy import lazy_exports

if TYPE_CHECKING:
    from hookscope.callbacks.accumulate import GradientAccumulation
    from hookscope.callbacks.checkpoint import Checkpoint
    from hookscope.callbacks.clip import GradientClip, GradientClipValue
    from hookscope.callbacks.cost import CallbackCost
    from hookscope.callbacks.doctor import Doctor
    from hookscope.callbacks.early_stopping import EarlyStopping
    from hookscope.callbacks.guard import NonFiniteGuard
    from hookscope.callbacks.layer_stats import ActivationStats, GradientStats, ParamRecord, StepStats
    from hookscope.callbacks.loggers import CSVLogger, MetricsLogger
    from hookscope.callbacks.lr_finder import LRFinder, LRFindResult, find_lr
    from hookscope.callbacks.precision import MixedPrecision
    from hookscope.callbacks.progress import ProgressBar
    from hookscope.callbacks.pruning import Pruning
    from hookscope.callbacks.run_folder import RunFolder
    from hookscope.callbacks.schedule import (
        CosineAnnealing,
        LRScheduler,
        OneCycle,
        ParamScheduler,
        combine_scheds,
        sched_const,
        sched_cos,
        sched_exp,
        sched_lin,
    )
    from hookscope.callbacks.trackers import MLflowCallback, TensorBoardCallback, WandbCallback
    from hookscope.train.recorder import Recorder

__all__ = [
    "ActivationStats",
    "CSVLogger",
    "CallbackCost",
    "Checkpoint",
    "CosineAnnealing",
    "Doctor",
    "EarlyStopping",
    "GradientAccumulation",
    "GradientClip",
    "GradientClipValue",
    "GradientStats",
    "LRFindResult",
    "LRFinder",
    "LRScheduler",
    "MLflowCallback",
    "MetricsLogger",
    "MixedPrecision",
    "NonFiniteGuard",
    "OneCycle",
    "ParamRecord",
    "ParamScheduler",
    "ProgressBar",
    "Pruning",
    "Recorder",
    "RunFolder",
    "StepStats",
    "TensorBoardCallback",
    "WandbCallback",
    "combine_scheds",
    "find_lr",
    "sched_const",
    "sched_cos",
    "sched_exp",
    "sched_lin",
]

_LAYER_STATS = "hookscope.callbacks.layer_stats"
_SCHEDULE = "hookscope.callbacks.schedule"
_TRACKERS = "hookscope.callbacks.trackers"
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "GradientAccumulation": "hookscope.callbacks.accumulate",
        "Checkpoint": "hookscope.callbacks.checkpoint",
        "GradientClip": "hookscope.callbacks.clip",
        "GradientClipValue": "hookscope.callbacks.clip",
        "CallbackCost": "hookscope.callbacks.cost",
        "Doctor": "hookscope.callbacks.doctor",
        "EarlyStopping": "hookscope.callbacks.early_stopping",
        "NonFiniteGuard": "hookscope.callbacks.guard",
        "MetricsLogger": "hookscope.callbacks.loggers",
        "CSVLogger": "hookscope.callbacks.loggers",
        "MLflowCallback": _TRACKERS,
        "TensorBoardCallback": _TRACKERS,
        "WandbCallback": _TRACKERS,
        "LRFinder": "hookscope.callbacks.lr_finder",
        "LRFindResult": "hookscope.callbacks.lr_finder",
        "find_lr": "hookscope.callbacks.lr_finder",
        "ActivationStats": _LAYER_STATS,
        "GradientStats": _LAYER_STATS,
        "ParamRecord": _LAYER_STATS,
        "StepStats": _LAYER_STATS,
        "MixedPrecision": "hookscope.callbacks.precision",
        "ProgressBar": "hookscope.callbacks.progress",
        "Pruning": "hookscope.callbacks.pruning",
        "Recorder": "hookscope.train.recorder",
        "RunFolder": "hookscope.callbacks.run_folder",
        "CosineAnnealing": _SCHEDULE,
        "LRScheduler": _SCHEDULE,
        "OneCycle": _SCHEDULE,
        "ParamScheduler": _SCHEDULE,
        "combine_scheds": _SCHEDULE,
        "sched_const": _SCHEDULE,
        "sched_cos": _SCHEDULE,
        "sched_exp": _SCHEDULE,
        "sched_lin": _SCHEDULE,
    },
)
