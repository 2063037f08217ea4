"""The garbage collector's time, from ``gc.callbacks`` (host timestamps at each collection's start and
stop): how much of a step it took, so a slow step can say the collector was running."""

from __future__ import annotations

import gc
import time
from typing import Any


class GcTime:
    """Seconds the collector ran since the last :meth:`take`, while :meth:`start`\\ ed."""

    def __init__(self) -> None:
        self._seconds = 0.0
        self._began: float | None = None
        self._on = False

    def start(self) -> None:
        if not self._on:
            gc.callbacks.append(self._callback)
            self._on = True

    def stop(self) -> None:
        if self._on:
            gc.callbacks.remove(self._callback)
            self._on = False
        self._began = None

    def take(self) -> float:
        """The collector's seconds since the last take."""
        seconds, self._seconds = self._seconds, 0.0
        return seconds

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        elif self._began is not None:
            self._seconds += time.perf_counter() - self._began
            self._began = None
