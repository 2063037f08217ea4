"""What synchronises the host with the GPU, by the file and line that did it: for the ``cuda`` tests.

Under ``torch.cuda.set_sync_debug_mode("warn")`` every synchronising call warns, attributed to the Python
line that made it. :class:`SyncWindow` turns the mode on in :meth:`~SyncWindow.open` and off again in
:meth:`~SyncWindow.close`, and counts the warnings in between per ``(file, line)``. The tests watch the
optimizer steps ``FIRST`` to ``LAST`` of :func:`small_cnn`'s training: those steps are neither recorded
by the doctor (steps 0-4, then every 50th), nor checked (its rules read their values in one bulk transfer
at the end of steps 4, 24, 44, ...), nor sampled by its ``host_syncs`` probe (steps 10, 30 and 50).
"""

from __future__ import annotations

import warnings
from collections import Counter

import torch
from torch import nn

from hookscope.doctor.timing.host_syncs import SYNC_WARNING

FIRST, LAST = 31, 38


def small_cnn() -> nn.Sequential:
    """The model the ``cuda`` sync tests train, for 1x16x16 images and 10 classes."""
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 8 * 8, 10)
    )


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
