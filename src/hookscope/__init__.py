"""hookscope: see inside PyTorch models with hooks, and train them with a callback loop.

This module only re-exports the public API; every name lives in the module named for what it is.
"""

from hookscope import metrics, viz
from hookscope.callbacks.doctor import Finding, diagnose
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
    "capture",
    "diagnose",
    "export_safetensors",
    "find_nonfinite",
    "load_checkpoint",
    "metrics",
    "read_stats",
    "select",
    "summary",
    "viz",
]
