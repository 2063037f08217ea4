"""Which callback event of a step took the longest: what ``step_stalls`` names as running in a stall.

A loop that dispatches events to callbacks (the Learner's dispatch table, through a callback's
``wrap_method``) wraps each event method with :meth:`CallbackTime.wrap`: two ``time.perf_counter`` calls
and a comparison per call, host time only (work a callback queues on a GPU counts where it is waited
for). :meth:`CallbackTime.take` hands over the slowest call since the last take, at the end of each step;
:attr:`CallbackTime.counted` is the callbacks' time since :meth:`CallbackTime.count_from_now` — the timing
recorder takes it out of the wait for data (a guard's snapshot in ``before_batch``, a checkpoint saved in
``after_batch`` are not the loader's time).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any


class CallbackTime:
    """The slowest wrapped call since the last :meth:`take`: its label and seconds."""

    def __init__(self) -> None:
        self.label: str | None = None
        self.seconds = 0.0
        self.counted = 0.0  # the wrapped calls' seconds since ``_since``
        self._since = time.perf_counter()

    def wrap(self, label: str, method: Callable[..., Any]) -> Callable[..., Any]:
        """``method`` timed under ``label`` (``"Checkpoint.after_epoch"``)."""
        clock = time.perf_counter

        @functools.wraps(method)
        def timed(*args: Any) -> Any:
            start = clock()
            try:
                return method(*args)
            finally:
                end = clock()
                seconds = end - start
                self.counted += end - max(start, self._since)
                if seconds > self.seconds:
                    self.label, self.seconds = label, seconds

        # the dispatch table's readers (``show_training_loop``) name a method's callback by ``__self__``
        timed.__self__ = getattr(method, "__self__", None)  # type: ignore[attr-defined]
        return timed

    def count_from_now(self) -> None:
        """Start :attr:`counted` again from zero; a call under way counts only its time from now on."""
        self.counted, self._since = 0.0, time.perf_counter()

    def take(self) -> tuple[str, float] | None:
        """The slowest call since the last take (None: no call), and start again."""
        label, seconds = self.label, self.seconds
        self.label, self.seconds = None, 0.0
        return None if label is None else (label, seconds)
