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
    from hookscope.doctor.preflight import preflight
    from hookscope.hooks.ablate import ablate
    from hookscope.hooks.capture import capture
    from hookscope.hooks.compare import compare
    from hookscope.hooks.nonfinite import find_nonfinite
    from hookscope.hooks.patch import patch
    from hookscope.hooks.select import select
    from hookscope.hooks.stats import read_stats
    from hookscope.hooks.summary import summary
    from hookscope.pruning.compact import compact
    from hookscope.pruning.masks import finalize_pruning, prune, sparsity
    from hookscope.train.callback import Callback
    from hookscope.train.checkpoint import export_safetensors, load_checkpoint
    from hookscope.train.data import DataLoaders
    from hookscope.train.learner import Learner
    from hookscope.viz.compare_runs import compare_runs
    from hookscope.watching import watch

__version__ = "0.1.0"

__all__ = [
    "Callback",
    "DataLoaders",
    "Learner",
    "__version__",
    "ablate",
    "callbacks",
    "capture",
    "compact",
    "compare",
    "compare_runs",
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

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "preflight": "hookscope.doctor.preflight",
        "diagnose": "hookscope.callbacks.doctor",
        "ablate": "hookscope.hooks.ablate",
        "capture": "hookscope.hooks.capture",
        "compare": "hookscope.hooks.compare",
        "find_nonfinite": "hookscope.hooks.nonfinite",
        "patch": "hookscope.hooks.patch",
        "select": "hookscope.hooks.select",
        "read_stats": "hookscope.hooks.stats",
        "summary": "hookscope.hooks.summary",
        "compact": "hookscope.pruning.compact",
        "finalize_pruning": "hookscope.pruning.masks",
        "prune": "hookscope.pruning.masks",
        "sparsity": "hookscope.pruning.masks",
        "Callback": "hookscope.train.callback",
        "export_safetensors": "hookscope.train.checkpoint",
        "load_checkpoint": "hookscope.train.checkpoint",
        "DataLoaders": "hookscope.train.data",
        "Learner": "hookscope.train.learner",
        "watch": "hookscope.watching",
        "compare_runs": "hookscope.viz.compare_runs",
    },
    submodules=("callbacks", "metrics", "testing", "viz"),
    # Plain data types and exceptions live in their modules only (hookscope.train.events.CancelFitException,
    # hookscope.doctor.findings.Finding...); the top level finds them for a release, with a warning.
    deprecated={
        "Ablation": "hookscope.hooks.ablate",
        "CallbackOrderError": "hookscope.train.callback",
        "CancelBackwardException": "hookscope.train.events",
        "CancelBatchException": "hookscope.train.events",
        "CancelEpochException": "hookscope.train.events",
        "CancelFitException": "hookscope.train.events",
        "CancelStepException": "hookscope.train.events",
        "CancelTrainException": "hookscope.train.events",
        "CancelValidException": "hookscope.train.events",
        "Capture": "hookscope.hooks.capture",
        "CaptureLimitError": "hookscope.hooks.capture",
        "CheckpointError": "hookscope.train.checkpoint",
        "CompactReport": "hookscope.pruning.compact",
        "Finding": "hookscope.doctor.findings",
        "HookSet": "hookscope.hooks.handles",
        "NonFiniteError": "hookscope.watching",
        "NonFiniteReport": "hookscope.hooks.nonfinite",
        "Patch": "hookscope.hooks.patch",
        "Record": "hookscope.hooks.capture",
        "RunningStats": "hookscope.hooks.stats",
        "SelectionError": "hookscope.hooks.select",
        "Sparsity": "hookscope.pruning.masks",
        "Summary": "hookscope.hooks.summary",
        "SummaryRow": "hookscope.hooks.summary",
        "TensorStats": "hookscope.hooks.stats",
        "Watch": "hookscope.watching",
    },
)
