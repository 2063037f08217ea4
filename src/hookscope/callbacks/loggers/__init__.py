"""Loggers: callbacks that write a run's metrics to files as training goes."""

from hookscope.callbacks.loggers.metrics import MetricsLogger

__all__ = ["MetricsLogger"]
