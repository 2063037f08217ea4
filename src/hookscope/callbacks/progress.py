"""ProgressBar: a rich progress display of epochs and batches, refreshed at a bounded rate.

The smoothed loss lives on the device; reading it is a host sync, so the bar reads it at most every
``refresh_every`` seconds — and the Learner only adds the bar when it is displayed (stdout is a terminal or a
notebook, or ``progress=True``). The display is always closed, also when training fails.

In a Jupyter notebook the bar is one HTML display updated in place (:class:`NotebookProgress`), with a
plain-text version of the same lines for viewers without HTML: no ``\r``, no terminal codes, and no
ipywidgets needed.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from html import escape
from typing import TYPE_CHECKING, Any

from hookscope.train.callback import Callback

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress


def stdout_is_interactive() -> bool:
    """True for a terminal or a Jupyter notebook: where a live bar is seen (not a log file or a pipe)."""
    from rich.console import Console  # rich loads when a bar may be shown, not with hookscope

    console = Console()
    return console.is_terminal or console.is_jupyter


def in_notebook() -> bool:
    """True inside a Jupyter kernel (an IPython shell with a kernel), where output is shown as rich
    displays rather than written to a terminal."""
    ipython = sys.modules.get("IPython")  # a notebook has imported it; elsewhere it is not loaded for this
    shell = ipython.get_ipython() if ipython is not None else None
    return getattr(shell, "kernel", None) is not None


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
        self._progress: Progress | NotebookProgress | None = None

    @property
    def is_open(self) -> bool:
        """True while the live display is running."""
        return self._progress is not None

    def before_fit(self) -> None:
        self._progress = NotebookProgress() if self.console is None and in_notebook() else self._rich()
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
        self._progress.print(_epoch_line(row))
        self._progress.refresh()

    def after_fit(self) -> None:
        self._close()

    def on_failure(self, exc: BaseException) -> None:
        self._close()

    def _rich(self) -> Progress:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        return Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[loss]}"),
            console=self.console,
            auto_refresh=False,
        )

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


@dataclass
class _Task:
    description: str
    total: int
    completed: int = 0
    fields: dict[str, Any] = field(default_factory=dict)


class NotebookProgress:
    """The bar in a Jupyter notebook: the calls of rich's ``Progress`` that :class:`ProgressBar` makes,
    drawn as one display updated in place — HTML ``<progress>`` bars, and the same lines as plain text
    (``epochs ██████░░░░ 3/5``) for a viewer without HTML."""

    WIDTH = 20  # characters of a text bar

    def __init__(self) -> None:
        self._tasks: dict[int, _Task] = {}
        self._lines: list[str] = []
        self._handle: Any = None

    @property
    def tasks(self) -> list[_Task]:
        """The bars shown, oldest first (as rich's ``Progress.tasks``)."""
        return list(self._tasks.values())

    def start(self) -> None:
        from IPython.display import display

        self._handle = display(self._bundle(), raw=True, display_id=True)

    def add_task(self, description: str, total: int, **fields: Any) -> int:
        task_id = max(self._tasks, default=-1) + 1
        self._tasks[task_id] = _Task(description, total, fields=fields)
        return task_id

    def update(self, task_id: int, completed: int | None = None, **fields: Any) -> None:
        task = self._tasks[task_id]
        task.completed = task.completed if completed is None else completed
        task.fields.update(fields)

    def advance(self, task_id: int, advance: int = 1) -> None:
        self._tasks[task_id].completed += advance

    def remove_task(self, task_id: int) -> None:
        del self._tasks[task_id]

    def print(self, line: str) -> None:
        """A line kept under the bars (a finished epoch's losses and metrics)."""
        self._lines.append(line)

    def refresh(self) -> None:
        if self._handle is not None:
            self._handle.update(self._bundle(), raw=True)

    def stop(self) -> None:
        self.refresh()
        self._handle = None

    def _bundle(self) -> dict[str, str]:
        """What the display shows, as HTML and as plain text."""
        bars = [(t.description, t.completed, t.total, t.fields.get("loss", "")) for t in self._tasks.values()]
        text = [f"{d}  {self._text_bar(c, n)} {c}/{n}  {loss}".rstrip() for d, c, n, loss in bars]
        html = "".join(
            f"<div><code>{escape(d)}</code> <progress value={c} max={max(n, 1)}></progress> {c}/{n} "
            f"{escape(loss)}</div>"
            for d, c, n, loss in bars
        )
        lines = "".join(f"<div><code>{escape(line)}</code></div>" for line in self._lines)
        return {"text/plain": "\n".join([*self._lines, *text]), "text/html": f"<div>{lines}{html}</div>"}

    def _text_bar(self, completed: int, total: int) -> str:
        done = min(self.WIDTH, round(self.WIDTH * completed / total)) if total else self.WIDTH
        return "█" * done + "░" * (self.WIDTH - done)
