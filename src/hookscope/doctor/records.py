"""Deprecated module: its contents moved, one concept per module.

- :mod:`hookscope.doctor.record_types`: ``StepStats``, ``ParamRecord``;
- :mod:`hookscope.doctor.selection`: ``with_parameters``, ``computing_leaves``, ``module_in_training``,
  ``RESHAPES``;
- :mod:`hookscope.doctor.recorders`: ``ActivationRecorder``, ``GradientRecorder``, ``LayerRecorder``;
- :mod:`hookscope.doctor.history_codec`: ``SAVED_RECORDS`` and the checkpoint form of histories.

The old names keep working for a release, with a ``DeprecationWarning``.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

_MOVED = {
    "StepStats": "record_types",
    "ParamRecord": "record_types",
    "with_parameters": "selection",
    "computing_leaves": "selection",
    "module_in_training": "selection",
    "RESHAPES": "selection",
    "TrainingOf": "selection",
    "ActivationRecorder": "recorders",
    "GradientRecorder": "recorders",
    "LayerRecorder": "recorders",
    "thin_if_full": "recorders",
    "SAVED_RECORDS": "history_codec",
    "history_state": "history_codec",
    "thin_factor": "history_codec",
    "thinned": "history_codec",
}


def __getattr__(name: str) -> Any:
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"hookscope.doctor.records.{name} moved to hookscope.doctor.{module}.{name}; the old path goes in "
        "the next release",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(f"hookscope.doctor.{module}"), name)
