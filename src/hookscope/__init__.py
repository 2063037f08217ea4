"""hookscope: see inside PyTorch models with hooks, and train them with a callback loop.

This module only re-exports the public API; every name lives in the module named for what it is. The
re-exports are lazy (PEP 562): ``import hookscope`` imports torch and nothing else heavy, and each name
imports its module the first time it is used.
"""

from typing import TYPE_CHECKING

from hookscope._lazy import lazy_exports

if TYPE_CHECKING:
    from hookscope import metrics, testing, viz
    from hookscope.callbacks.doctor import diagnose
    from hookscope.doctor.findings import Finding
    from hookscope.hooks.capture import Capture, CaptureLimitError, Record, capture
    from hookscope.hooks.handles import HookSet
    from hookscope.hooks.nonfinite import NonFiniteReport, find_nonfinite
    from hookscope.hooks.select import SelectionError, select
    from hookscope.hooks.stats import RunningStats, TensorStats, read_stats
    from hookscope.hooks.summary import Summary, SummaryRow, summary
    from hookscope.train.callback import Callback, CallbackOrderError
    from hookscope.train.checkpoint import CheckpointError, export_safetensors, load_checkpoint
    from hookscope.train.data import DataLoaders
    from hookscope.train.events import (
        CancelBackwardException,
        CancelBatchException,
        CancelEpochException,
        CancelFitException,
        CancelStepException,
        CancelTrainException,
        CancelValidException,
    )
    from hookscope.train.learner import Learner

__version__ = "0.1.0"

__all__ = [
    "Callback",
    "CallbackOrderError",
    "CancelBackwardException",
    "CancelBatchException",
    "CancelEpochException",
    "CancelFitException",
    "CancelStepException",
    "CancelTrainException",
    "CancelValidException",
    "Capture",
    "CaptureLimitError",
    "CheckpointError",
    "DataLoaders",
    "Finding",
    "HookSet",
    "Learner",
    "NonFiniteReport",
    "Record",
    "RunningStats",
    "SelectionError",
    "Summary",
    "SummaryRow",
    "TensorStats",
    "__version__",
    "callbacks",
    "capture",
    "diagnose",
    "export_safetensors",
    "find_nonfinite",
    "load_checkpoint",
    "metrics",
    "read_stats",
    "select",
    "summary",
    "testing",
    "viz",
]

_EVENTS = "hookscope.train.events"
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "Finding": "hookscope.doctor.findings",
        "diagnose": "hookscope.callbacks.doctor",
        "Capture": "hookscope.hooks.capture",
        "CaptureLimitError": "hookscope.hooks.capture",
        "Record": "hookscope.hooks.capture",
        "capture": "hookscope.hooks.capture",
        "HookSet": "hookscope.hooks.handles",
        "NonFiniteReport": "hookscope.hooks.nonfinite",
        "find_nonfinite": "hookscope.hooks.nonfinite",
        "SelectionError": "hookscope.hooks.select",
        "select": "hookscope.hooks.select",
        "RunningStats": "hookscope.hooks.stats",
        "TensorStats": "hookscope.hooks.stats",
        "read_stats": "hookscope.hooks.stats",
        "Summary": "hookscope.hooks.summary",
        "SummaryRow": "hookscope.hooks.summary",
        "summary": "hookscope.hooks.summary",
        "Callback": "hookscope.train.callback",
        "CallbackOrderError": "hookscope.train.callback",
        "CheckpointError": "hookscope.train.checkpoint",
        "export_safetensors": "hookscope.train.checkpoint",
        "load_checkpoint": "hookscope.train.checkpoint",
        "DataLoaders": "hookscope.train.data",
        "CancelBackwardException": _EVENTS,
        "CancelBatchException": _EVENTS,
        "CancelEpochException": _EVENTS,
        "CancelFitException": _EVENTS,
        "CancelStepException": _EVENTS,
        "CancelTrainException": _EVENTS,
        "CancelValidException": _EVENTS,
        "Learner": "hookscope.train.learner",
    },
    submodules=("callbacks", "metrics", "testing", "viz"),
)
