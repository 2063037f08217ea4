"""Early stopping: end the fit when a monitored value has not improved for ``patience`` epochs."""

from __future__ import annotations

import math
from typing import Any, Literal

from hookscope.train.callback import Callback
from hookscope.train.events import CancelFitException


class EarlyStopping(Callback):
    """Stop training (``CancelFitException``) after ``patience`` epochs without improvement of ``monitor``.

    ``monitor`` is a key of ``learn.recorder.history`` (``"valid_loss"``, ``"train_loss"``, a metric
    name). An epoch improves when the value beats the best so far by more than ``min_delta`` (lower for
    ``mode="min"``, higher for ``"max"``); a NaN never improves. After the stop, ``stopped_epoch`` is the
    epoch it stopped at and ``best_epoch`` the epoch of the best value. The count carries over a
    checkpoint through ``state_dict``; a new ``fit`` otherwise starts counting afresh.
    """

    # Last at after_epoch: the stop must not rob the progress bar, checkpoints (order 90) or loggers of
    # the final epoch.
    order = 100
    run_after = ("Recorder",)
    run_during_sweep = False  # a sweep's diverging loss is no reason to stop the real run

    def __init__(
        self,
        monitor: str = "valid_loss",
        mode: Literal["min", "max"] = "min",
        patience: int = 1,
        min_delta: float = 0.0,
    ) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"EarlyStopping: mode={mode!r}; use 'min' (losses) or 'max' (accuracies)")
        if patience < 1:
            raise ValueError(f"EarlyStopping: patience={patience} must be >= 1")
        if min_delta < 0:
            raise ValueError(
                f"EarlyStopping: min_delta={min_delta} must be >= 0 (it is a margin, not a sign)"
            )
        self.monitor = monitor
        self.mode = mode
        self.patience = patience
        self.min_delta = min_delta
        self._restored = False
        self._reset()

    def before_fit(self) -> None:
        if self.learn.dls.valid is None and self.monitor != "train_loss":
            # Without validation the value is NaN every epoch: the fit would stop after `patience` epochs.
            raise ValueError(
                f"EarlyStopping: monitor={self.monitor!r} is measured on validation data, but the learner "
                "has none; pass hs.DataLoaders(train, valid) or monitor='train_loss'"
            )
        if not self._restored:
            self._reset()
        self._restored = False

    def after_epoch(self) -> None:
        value = self._latest()
        epoch = self.learn.epoch
        if self._improved(value):
            self.best, self.best_epoch, self.wait = value, epoch, 0
            return
        self.wait += 1
        if self.wait >= self.patience:
            self.stopped_epoch = epoch
            raise CancelFitException()

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "best_epoch": self.best_epoch, "wait": self.wait}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.best_epoch, self.wait = state["best"], state["best_epoch"], state["wait"]
        self.stopped_epoch = None
        self._restored = True

    def _reset(self) -> None:
        self.best: float | None = None
        self.best_epoch: int | None = None
        self.wait = 0
        self.stopped_epoch: int | None = None

    def _improved(self, value: float) -> bool:
        if math.isnan(value):
            return False
        if self.best is None:
            return True
        if self.mode == "min":
            return value < self.best - self.min_delta
        return value > self.best + self.min_delta

    def _latest(self) -> float:
        history = self.learn.recorder.history
        row = history[-1] if history else {}
        if self.monitor not in row:
            keys = ", ".join(k for k in row if k not in ("epoch", "time")) or "none recorded yet"
            raise KeyError(
                f"EarlyStopping: monitor={self.monitor!r} is not in learn.recorder.history "
                f"(available: {keys}); pass one of those"
            )
        return float(row[self.monitor])
