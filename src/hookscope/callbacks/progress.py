"""ProgressBar: a rich progress display of epochs and batches, refreshed at a bounded rate.

The smoothed loss lives on the device; reading it is a host sync, so the bar reads it at most every
``refresh_every`` seconds — and the Learner only adds the bar when it is displayed (stdout is a terminal,
or ``progress=True``). The display is always closed, also when training fails.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from hookscope.train.callback import Callback

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress


def stdout_is_interactive() -> bool:
    """True for a terminal or a Jupyter notebook: where a live bar is seen (not a log file or a pipe)."""
    from rich.console import Console  # rich loads when a bar may be shown, not with hookscope

    console = Console()
    return console.is_terminal or console.is_jupyter


class ProgressBar(Callback):
    """One bar for the epochs and one for the batches of the current phase; a line per finished epoch."""

    order = 90
    rank_zero_only = True  # under torchrun one bar, not one per rank

    @staticmethod
    def is_seen() -> bool:
        """True where a live bar is seen (see :func:`stdout_is_interactive`): the Learner adds one by default
        only there."""
        return stdout_is_interactive()

    def __init__(self, refresh_every: float = 0.5, console: Console | None = None) -> None:
        self.refresh_every = refresh_every
        self.console = console
        self._progress: Progress | None = None

    @property
    def is_open(self) -> bool:
        """True while the live display is running."""
        return self._progress is not None

    def before_fit(self) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[loss]}"),
            console=self.console,
            auto_refresh=False,
        )
        self._progress.start()
        self._epochs = self._progress.add_task("epochs", total=self.learn.n_epoch, loss="")
        self._batches = None
        self._last = 0.0

    def before_train(self) -> None:
        self._start_phase("train")

    def before_validate(self) -> None:
        self._start_phase("valid")

    def after_batch(self) -> None:
        now = time.perf_counter()
        if self._progress is None or now - self._last < self.refresh_every:
            return
        self._last = now
        loss = self.learn.recorder.smooth_loss if self.learn.training else math.nan
        text = "" if math.isnan(loss) else f"loss {loss:.4f}"
        self._progress.update(self._batches, completed=self.learn.iter + 1, loss=text)
        self._progress.refresh()

    def after_train(self) -> None:
        self._end_phase()

    def after_validate(self) -> None:
        self._end_phase()

    def after_epoch(self) -> None:
        if self._progress is None:
            return
        self._progress.advance(self._epochs)
        row = self.learn.recorder.history[-1] if self.learn.recorder.history else {}
        self._progress.console.print(_epoch_line(row))
        self._progress.refresh()

    def after_fit(self) -> None:
        self._close()

    def on_failure(self, exc: BaseException) -> None:
        self._close()

    def _start_phase(self, phase: str) -> None:
        if self._progress is None:
            return
        description = f"epoch {self.learn.epoch + 1} {phase}"  # people count epochs from 1
        self._batches = self._progress.add_task(description, total=self.learn.n_iter, loss="")
        self._last = time.perf_counter()
        self._progress.refresh()

    def _end_phase(self) -> None:
        if self._progress is None or self._batches is None:
            return
        self._progress.remove_task(self._batches)
        self._batches = None
        self._progress.refresh()

    def _close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def _epoch_line(row: dict[str, object]) -> str:
    """``epoch 1  train_loss 0.1234 ...``: the row's epoch shown from 1; the row itself keeps it 0-based."""
    shown = {**row, "epoch": row["epoch"] + 1} if isinstance(row.get("epoch"), int) else row
    return "  ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in shown.items())
