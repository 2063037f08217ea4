"""Loggers: callbacks that write a run's metrics to files as training goes (re-exported lazily)."""

from typing import TYPE_CHECKING

from hookscope._lazy import lazy_exports

if TYPE_CHECKING:
    from hookscope.callbacks.loggers.metrics import CSVLogger, MetricsLogger

__all__ = ["CSVLogger", "MetricsLogger"]

_METRICS = "hookscope.callbacks.loggers.metrics"
__getattr__, __dir__ = lazy_exports(__name__, {"CSVLogger": _METRICS, "MetricsLogger": _METRICS})
