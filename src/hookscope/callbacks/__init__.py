"""Built-in callbacks, one file per family."""

from hookscope.callbacks.accumulate import GradientAccumulation
from hookscope.callbacks.checkpoint import Checkpoint
from hookscope.callbacks.clip import GradientClip, GradientClipValue
from hookscope.callbacks.cost import CallbackCost
from hookscope.callbacks.doctor import Doctor
from hookscope.callbacks.early_stopping import EarlyStopping
from hookscope.callbacks.guard import NonFiniteGuard
from hookscope.callbacks.loggers import MetricsLogger
from hookscope.callbacks.lr_finder import LRFinder, LRFindResult
from hookscope.callbacks.monitor import ActivationStats, GradientStats, ParamRecord, StepStats
from hookscope.callbacks.precision import MixedPrecision
from hookscope.callbacks.progress import ProgressBar
from hookscope.callbacks.recorder import Recorder
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

__all__ = [
    "ActivationStats",
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
    "MetricsLogger",
    "MixedPrecision",
    "NonFiniteGuard",
    "OneCycle",
    "ParamRecord",
    "ParamScheduler",
    "ProgressBar",
    "Recorder",
    "StepStats",
    "combine_scheds",
    "sched_const",
    "sched_cos",
    "sched_exp",
    "sched_lin",
]
