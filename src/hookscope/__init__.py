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
    from hookscope.doctor.preflight import preflight
    from hookscope.hooks.ablate import Ablation, ablate
    from hookscope.hooks.capture import Capture, CaptureLimitError, Record, capture
    from hookscope.hooks.handles import HookSet
    from hookscope.hooks.nonfinite import NonFiniteReport, find_nonfinite
    from hookscope.hooks.patch import Patch, patch
    from hookscope.hooks.select import SelectionError, select
    from hookscope.hooks.stats import RunningStats, TensorStats, read_stats
    from hookscope.hooks.summary import Summary, SummaryRow, summary
    from hookscope.pruning.compact import CompactReport, compact
    from hookscope.pruning.masks import Sparsity, finalize_pruning, prune, sparsity
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
    from hookscope.watching import NonFiniteError, Watch, watch

__version__ = "0.1.0"

__all__ = [
    "Ablation",
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
    "CompactReport",
    "DataLoaders",
    "Finding",
    "HookSet",
    "Learner",
    "NonFiniteError",
    "NonFiniteReport",
    "Patch",
    "Record",
    "RunningStats",
    "SelectionError",
    "Sparsity",
    "Summary",
    "SummaryRow",
    "TensorStats",
    "Watch",
    "__version__",
    "ablate",
    "callbacks",
    "capture",
    "compact",
    "diagnose",
    "export_safetensors",
    "finalize_pruning",
    "find_nonfinite",
    "load_checkpoint",
    "metrics",
    "patch",
    "preflight",
    "prune",
    "read_stats",
    "select",
    "sparsity",
    "summary",
    "testing",
    "viz",
    "watch",
]

_EVENTS = "hookscope.train.events"
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "Finding": "hookscope.doctor.findings",
        "preflight": "hookscope.doctor.preflight",
        "diagnose": "hookscope.callbacks.doctor",
        "Ablation": "hookscope.hooks.ablate",
        "ablate": "hookscope.hooks.ablate",
        "Capture": "hookscope.hooks.capture",
        "CaptureLimitError": "hookscope.hooks.capture",
        "Record": "hookscope.hooks.capture",
        "capture": "hookscope.hooks.capture",
        "HookSet": "hookscope.hooks.handles",
        "NonFiniteReport": "hookscope.hooks.nonfinite",
        "find_nonfinite": "hookscope.hooks.nonfinite",
        "Patch": "hookscope.hooks.patch",
        "patch": "hookscope.hooks.patch",
        "SelectionError": "hookscope.hooks.select",
        "select": "hookscope.hooks.select",
        "RunningStats": "hookscope.hooks.stats",
        "TensorStats": "hookscope.hooks.stats",
        "read_stats": "hookscope.hooks.stats",
        "Summary": "hookscope.hooks.summary",
        "SummaryRow": "hookscope.hooks.summary",
        "summary": "hookscope.hooks.summary",
        "CompactReport": "hookscope.pruning.compact",
        "compact": "hookscope.pruning.compact",
        "Sparsity": "hookscope.pruning.masks",
        "finalize_pruning": "hookscope.pruning.masks",
        "prune": "hookscope.pruning.masks",
        "sparsity": "hookscope.pruning.masks",
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
        "NonFiniteError": "hookscope.watching",
        "Watch": "hookscope.watching",
        "watch": "hookscope.watching",
    },
    submodules=("callbacks", "metrics", "testing", "viz"),
)
