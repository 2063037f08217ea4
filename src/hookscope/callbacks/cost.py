"""CallbackCost: how much wall time each callback spends at each event — cheap enough to leave on.

It uses the dispatch table's general ``wrap_method`` mechanism (``hookscope.train.callback``): when the
table is built, every other callback's event method passes through :meth:`CallbackCost.wrap_method`, which
wraps it in a timer (two ``perf_counter`` calls and two dict updates, well under a microsecond).
Callbacks that do not define an event are not in the table, so they cost nothing.
Times are host wall times: work a callback queues on an accelerator is counted when it is waited for.
"""

from __future__ import annotations

import functools
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from hookscope.train.callback import Callback
from hookscope.train.learner import method_owner


class CallbackCost(Callback):
    """Per-callback, per-event timings of the last ``fit`` (``costs``, ``report()``); ``show`` prints them."""

    order = -100

    def __init__(self, show: bool = False) -> None:
        self.show = show
        self._seconds: dict[tuple[str, str], float] = defaultdict(float)
        self._calls: dict[tuple[str, str], int] = defaultdict(int)
        self.fit_seconds = 0.0

    @property
    def costs(self) -> dict[str, dict[str, dict[str, float]]]:
        """``{callback name: {event: {"seconds": total, "calls": n}}}`` for the last fit."""
        out: dict[str, dict[str, dict[str, float]]] = {}
        for (name, event), seconds in self._seconds.items():
            out.setdefault(name, {})[event] = {"seconds": seconds, "calls": self._calls[(name, event)]}
        return out

    def report(self) -> str:
        """A table, most expensive first: callback, event, calls, total ms, µs per call, share of the fit."""
        rows = sorted(self._seconds.items(), key=lambda item: -item[1])
        fit = self.fit_seconds or sum(self._seconds.values()) or 1.0
        lines = [f"{'callback':<22}{'event':<18}{'calls':>8}{'total ms':>11}{'µs/call':>10}{'% of fit':>10}"]
        for (name, event), seconds in rows:
            calls = self._calls[(name, event)]
            lines.append(
                f"{name:<22}{event:<18}{calls:>8}{seconds * 1e3:>11.2f}"
                f"{seconds / calls * 1e6:>10.1f}{100 * seconds / fit:>10.2f}"
            )
        return "\n".join(lines)

    def before_fit(self) -> None:
        self._seconds.clear()
        self._calls.clear()
        self._fit_start = time.perf_counter()

    def after_fit(self) -> None:
        self.fit_seconds = time.perf_counter() - self._fit_start
        if self.show:
            print(self.report())

    def wrap_method(self, event: str, method: Callable[..., Any]) -> Callable[..., Any]:
        """``method`` (another callback's handler of ``event``) timed into :attr:`costs`."""
        owner = method_owner(method)  # also under a wrapper placed before this one
        if owner is self:
            return method
        key = (owner.name if isinstance(owner, Callback) else repr(owner), event)
        seconds, calls, clock = self._seconds, self._calls, time.perf_counter

        @functools.wraps(method)
        def timed_method(*args: Any) -> Any:
            start = clock()
            try:
                return method(*args)
            finally:
                seconds[key] += clock() - start
                calls[key] += 1

        return timed_method
