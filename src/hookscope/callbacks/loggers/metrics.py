"""MetricsLogger: ``metrics.csv`` and ``metrics.jsonl``, one row per epoch and one per ``every`` steps.

Both files hold the same rows, told apart by the ``kind`` column (``"epoch"`` or ``"step"``), so a
spreadsheet, pandas or ``jq`` read them without knowing hookscope. Step losses stay on the device until
the end of the epoch (or ``flush_rows`` step rows) and are then read back in one transfer: logging never
adds a per-step host sync. The files are then rewritten atomically, so a crash leaves the last complete
version. The rows are part of ``state_dict``, so a resumed run continues the same files. They are read
back with :func:`hookscope.run_reader.read_metrics`.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

import torch

from hookscope._deprecation import moved_names, renamed_keywords
from hookscope.atomic import atomic_write_text
from hookscope.train.callback import Callback

LEADING_COLUMNS = ("kind", "epoch", "step")

# read_metrics reads a run folder, for viz as well: it lives below both, with the run folder's readers
__getattr__ = moved_names(__name__, {"read_metrics": "hookscope.run_reader"})


class MetricsLogger(Callback):
    """Log per-epoch metrics (from ``learn.recorder.history``) and every ``every``-th training step.

    The folder ``path`` receives ``metrics.csv`` and ``metrics.jsonl``. ``every`` bounds the rate of step
    rows; ``every=0`` logs epochs only. In a long epoch the files are also rewritten every ``flush_rows`` step
    rows, so a live run can be followed (one transfer per ``every * flush_rows`` steps).
    """

    run_after = ("Recorder",)
    run_valid = False
    run_during_sweep = False  # an lr_find sweep's steps are not the run's

    @renamed_keywords(folder="path")
    def __init__(self, path: str | Path, every: int = 10, flush_rows: int = 50) -> None:
        if every < 0 or flush_rows < 1:
            raise ValueError(
                f"MetricsLogger: every={every}, flush_rows={flush_rows}; use every >= 0 (0 logs epochs only) "
                "and flush_rows >= 1"
            )
        self.folder = Path(path)
        self.every = every
        self.flush_rows = flush_rows
        self.rows: list[dict[str, Any]] = []
        self._pending: list[tuple[int, int, torch.Tensor, float]] = []

    def after_step(self) -> None:
        step = self.learn.training_step
        if self.every == 0 or step % self.every != 0:
            return
        lr = self.learn.opt.param_groups[0]["lr"]
        self._pending.append((self.learn.epoch, step, self.learn.loss.detach(), float(lr)))
        if len(self._pending) >= self.flush_rows:
            self._take_pending()
            self.write()

    def after_epoch(self) -> None:
        self._take_pending()
        row = dict(self.learn.recorder.history[-1])
        self.rows.append(
            {"kind": "epoch", "epoch": row.pop("epoch"), "step": self.learn.training_step, **row}
        )
        self.write()

    def after_fit(self) -> None:
        self._take_pending()
        self.write()

    def on_failure(self, exc: BaseException) -> None:
        """A crashed or interrupted run keeps every step row it logged, not only the finished epochs (a fit
        that failed before logging anything writes nothing: its folder may be what failed)."""
        if self.rows or self._pending:
            self.after_fit()

    def write(self) -> None:
        """Rewrite both files from the rows logged so far."""
        atomic_write_text(
            self.folder / "metrics.jsonl", "".join(json.dumps(_clean(r)) + "\n" for r in self.rows)
        )
        atomic_write_text(self.folder / "metrics.csv", _to_csv(self.rows))

    def state_dict(self) -> dict[str, Any]:
        """The rows so far, pending step rows included (a checkpoint reads them back anyway)."""
        self._take_pending()
        return {"rows": [dict(r) for r in self.rows]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rows = [dict(r) for r in state["rows"]]

    def _take_pending(self) -> None:
        if not self._pending:
            return
        losses = torch.stack([loss.float().reshape(()) for _, _, loss, _ in self._pending]).tolist()
        for (epoch, step, _, lr), loss in zip(self._pending, losses, strict=True):
            self.rows.append({"kind": "step", "epoch": epoch, "step": step, "train_loss": loss, "lr": lr})
        self._pending = []


def _to_csv(rows: list[dict[str, Any]]) -> str:
    columns = list(LEADING_COLUMNS)
    for row in rows:
        columns.extend(key for key in row if key not in columns)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def _clean(row: dict[str, Any]) -> dict[str, Any]:
    """JSON has no NaN/Infinity: write them as null so every JSON reader accepts the file."""
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in row.items()}


class CSVLogger(MetricsLogger):
    """fastai's name for the CSV logger (``learn.csv_logger``): a :class:`MetricsLogger` writing
    ``metrics.csv`` and ``metrics.jsonl`` into ``path``, the working directory by default."""

    @renamed_keywords(folder="path")
    def __init__(self, path: str | Path = ".", every: int = 10, flush_rows: int = 50) -> None:
        super().__init__(path, every=every, flush_rows=flush_rows)

    def read_log(self) -> Any:
        """The logged rows as a pandas DataFrame, as fastai's ``read_log()`` returns them."""
        try:
            import pandas as pd
        except ImportError as err:
            raise ImportError(f"CSVLogger.read_log needs pandas ({err}); pip install pandas") from err
        return pd.read_csv(self.folder / "metrics.csv")
