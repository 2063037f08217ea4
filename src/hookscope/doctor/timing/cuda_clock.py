"""Phase times on a CUDA device: an event recorded on the current stream at each phase change, read in
bulk when the doctor reads (never a synchronisation per step).

The time between two events is the device's time between reaching them: a phase whose kernels keep the
device busy measures their time, and a phase where the host makes the device wait (loading the next
batch) measures how long the device stood idle. Events are taken from a pool and given back once read,
so a run creates only as many as are in flight between two reads. :meth:`CudaClock.take` reads the steps
whose last event the device has reached (``Event.query``, no wait); the others stay for the next read,
unless more than ``max_pending`` steps wait, when the oldest are waited for (bounded memory).
"""

from __future__ import annotations

from collections import deque

import numpy as np
import torch

from hookscope.doctor.timing.phases import COLUMNS, GC, WAIT, callbacks_to_other

# a closed step: its number, the collector's, the wait's and the data phase's callbacks' seconds, its first
# event and its marks
_Pending = tuple[int, tuple[float, float, float], torch.cuda.Event, list[tuple[int, torch.cuda.Event]]]


class EventPool:
    """Timing events, reused: :meth:`get` gives a free one (made when none is free), :meth:`put`
    returns it."""

    def __init__(self) -> None:
        self._free: list[torch.cuda.Event] = []
        self.made = 0

    def get(self) -> torch.cuda.Event:
        if self._free:
            return self._free.pop()
        self.made += 1
        return torch.cuda.Event(enable_timing=True)

    def put(self, events: list[torch.cuda.Event]) -> None:
        self._free.extend(events)


class CudaClock:
    """Records an event per phase change on ``device``; a closed step keeps its events until read."""

    def __init__(self, device: torch.device, max_pending: int = 256) -> None:
        self.device, self.max_pending = device, max_pending
        self.pool = EventPool()
        self._start = self._record()  # the end of the previous step: the first event of the next one
        self._marks: list[tuple[int, torch.cuda.Event]] = []
        self._ready: list[tuple[int, np.ndarray]] = []  # read early to keep the pending steps bounded
        self._pending: deque[_Pending] = deque()

    def mark(self, ended: int) -> None:
        """Phase ``ended`` ends when the device reaches this point of the stream."""
        self._marks.append((ended, self._record()))

    def close(
        self, step: int, gc_seconds: float, wait_seconds: float = 0.0, callback_seconds: float = 0.0
    ) -> None:
        """The step ``step`` ended: its events wait for :meth:`take`; its last one starts the next step.
        The collector's seconds, the thread's wait for a core and the callbacks' seconds in its data
        phase go into its row."""
        if not self._marks:
            return
        marks, self._marks = self._marks, []
        self._pending.append((step, (gc_seconds, wait_seconds, callback_seconds), self._start, marks))
        self._start = marks[-1][1]
        while len(self._pending) > self.max_pending:
            self._pending[0][3][-1][1].synchronize()  # bounded: wait for the oldest rather than pile up
            self._ready.append(self._read_one())

    @property
    def waiting(self) -> int:
        """Steps closed and not taken yet (finished on the device or not)."""
        return len(self._ready) + len(self._pending)

    def take(self, wait: bool = False) -> list[tuple[int, np.ndarray]]:
        """The rows of the closed steps the device has finished, oldest first; ``wait``: all of them
        (one synchronisation, at the end of a run or for a checkpoint)."""
        if wait and self._pending:
            self._pending[-1][3][-1][1].synchronize()
        rows, self._ready = self._ready, []
        while self._pending and self._pending[0][3][-1][1].query():
            rows.append(self._read_one())
        return rows

    def restart(self) -> None:
        """Forget the marks since the last step (after a pause the loop did not tell us about)."""
        self.pool.put([event for _, event in self._marks])
        self._marks = []
        self._start = self._record()  # the old start may still end a pending step: it is not reused

    def _read_one(self) -> tuple[int, np.ndarray]:
        step, host, start, marks = self._pending.popleft()
        row = np.zeros(len(COLUMNS))
        previous = start
        for phase, event in marks:
            row[phase] += previous.elapsed_time(event) / 1e3
            previous = event
        row[GC], row[WAIT] = host[:2]
        callbacks_to_other(row, host[2])
        # the step's last event is the next step's start: it goes back once that step is read
        self.pool.put([start, *(event for _, event in marks[:-1])])
        return step, row

    def _record(self) -> torch.cuda.Event:
        event = self.pool.get()
        event.record(torch.cuda.current_stream(self.device))
        return event
