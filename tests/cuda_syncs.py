"""What synchronises the host with the GPU, by the file and line that did it: for the ``cuda`` tests.

Under ``torch.cuda.set_sync_debug_mode("warn")`` every synchronising call warns, attributed to the Python
line that made it. :class:`SyncWindow` turns the mode on in :meth:`~SyncWindow.open` and off again in
:meth:`~SyncWindow.close`, and counts the warnings in between per ``(file, line)``.
"""

from __future__ import annotations

import warnings
from collections import Counter

import torch

from hookscope.doctor.timing.host_syncs import SYNC_WARNING


class SyncWindow:
    """Counts the host syncs made between :meth:`open` and :meth:`close` (both idempotent)."""

    def __init__(self) -> None:
        self.sites: Counter[tuple[str, int]] = Counter()
        self._catcher: warnings.catch_warnings | None = None
        self._caught: list[warnings.WarningMessage] = []

    def open(self) -> None:
        if self._catcher is not None:
            return
        self._catcher = warnings.catch_warnings(record=True)
        self._caught = self._catcher.__enter__()
        warnings.filterwarnings("always", message=SYNC_WARNING)  # each sync, not once per line
        torch.cuda.set_sync_debug_mode("warn")

    def close(self) -> None:
        if self._catcher is None:
            return
        torch.cuda.set_sync_debug_mode(0)
        for caught in self._caught:
            if SYNC_WARNING in str(caught.message):
                self.sites[(caught.filename, caught.lineno)] += 1
        self._catcher.__exit__(None, None, None)
        self._catcher = None
