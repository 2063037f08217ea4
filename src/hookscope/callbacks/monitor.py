"""Deprecated module: ``ActivationStats`` and ``GradientStats`` live in :mod:`hookscope.callbacks.layer_stats`
(this module held no monitor). The old path keeps working for a release, with a ``DeprecationWarning``."""

from __future__ import annotations

import warnings

from hookscope.callbacks.layer_stats import (
    ActivationStats,
    GradientStats,
    ParamRecord,
    StepStats,
    with_parameters,
)

__all__ = ["ActivationStats", "GradientStats", "ParamRecord", "StepStats", "with_parameters"]

warnings.warn(
    "hookscope.callbacks.monitor is now hookscope.callbacks.layer_stats; the old path goes in the next "
    "release",
    DeprecationWarning,
    stacklevel=2,
)
