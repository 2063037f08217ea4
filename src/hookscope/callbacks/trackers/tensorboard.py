"""TensorBoardCallback: a fit in TensorBoard, through ``torch.utils.tensorboard.SummaryWriter``.

Scalars (``train/loss``, ``train/lr``, ``epoch/*``, per-layer statistics grouped by statistic), histograms
of activations and output gradients (bins counted on the device), the doctor's findings as text at their
step (``doctor/<kind>``), the configuration, model summary and data description as text, the sample
predictions as a table and an image grid, and optionally the final weights as ``model.safetensors`` in
the log folder. A resumed fit writes with ``purge_step`` at the step it resumes from, so TensorBoard
drops what the interrupted run logged after its checkpoint: the steps continue without overlap.
"""

from __future__ import annotations

import json
import os
import shutil
from datetime import datetime
from pathlib import Path
from typing import Any

from hookscope.callbacks.trackers.base import Tracker, relative_to, require
from hookscope.callbacks.trackers.records import Predictions, Rows, findings_markdown, predictions_markdown
from hookscope.doctor.findings import Finding
from hookscope.hooks.stats import TensorStats


class TensorBoardCallback(Tracker):
    """Log the fit to TensorBoard event files in ``log_dir``.

    ``log_dir=None`` writes to ``tensorboard/`` in the run folder when a
    :class:`~hookscope.callbacks.RunFolder` is attached, else to ``runs/tensorboard-<date>-<time>-<pid>``
    in the working directory. ``run_name``: write to the subfolder ``<log_dir>/<run_name>`` — runs side
    by side sharing one ``log_dir`` each need their own (``tensorboard --logdir <log_dir>`` shows them
    as separate runs; runs writing one folder would be merged into one). Rates and the ``log_*``
    switches are those of :class:`~hookscope.callbacks.trackers.base.Tracker`; fastai's ``log_preds`` is
    on by default.
    """

    label = "TensorBoard"

    def __init__(
        self,
        log_dir: str | Path | None = None,
        run_name: str | None = None,
        log_preds: bool = True,
        log_model: bool = False,
        log_dataset: bool = False,
        **rates: Any,
    ) -> None:
        super().__init__(log_preds=log_preds, log_model=log_model, log_dataset=log_dataset, **rates)
        self.log_dir, self.run_name = log_dir, run_name
        self.writer: Any = None

    def open_run(self, folder: Path) -> str:
        tensorboard = require("torch.utils.tensorboard", type(self).__name__)
        log_dir = self._log_dir(folder)
        # Resuming: drop what the interrupted run wrote at or after this step (TensorBoard's purge).
        purge = self.learn.training_step if self.learn.resumed_from is not None else None
        self.writer = tensorboard.SummaryWriter(str(log_dir), purge_step=purge)
        self.run_id = relative_to(log_dir, folder)
        return self.run_id

    def _log_dir(self, folder: Path) -> Path:
        if self.log_dir is not None:
            return Path(self.log_dir) / (self.run_name or "")
        if self.run_id is not None:  # continue where the run being resumed wrote
            return folder / self.run_id
        if self.run_folder() is not None:
            return folder / "tensorboard" / (self.run_name or "")
        default = f"tensorboard-{datetime.now():%Y%m%d-%H%M%S}-{os.getpid()}"  # pid: runs of one second
        return folder / "runs" / (self.run_name or default)

    def how_to_open(self, location: str) -> str:
        return f"tensorboard --logdir {location}"

    def write_scalars(self, rows: Rows) -> None:
        for step in sorted(rows):
            for key, value in rows[step].items():
                self.writer.add_scalar(key, value, step)

    def write_histograms(self, step: int, histograms: dict[str, TensorStats]) -> None:
        for tag, stats in histograms.items():
            counts = stats.histogram
            num = int(counts.sum())
            if num == 0:
                continue  # every sampled value was NaN/Inf: nothing to draw
            second_moment = stats.std**2 + stats.mean**2
            self.writer.add_histogram_raw(
                tag,
                min=float(stats.edges[0]),
                max=float(stats.edges[-1]),
                num=num,
                sum=stats.mean * num,
                sum_squares=second_moment * num,
                bucket_limits=stats.edges[1:].tolist(),
                bucket_counts=counts.tolist(),
                global_step=step,
            )

    def write_findings(self, new: list[Finding], every: list[Finding]) -> None:
        for finding in new:
            self.writer.add_text(f"doctor/{finding.kind}", findings_markdown([finding]), finding.step)

    def write_config(self, config: dict[str, Any]) -> None:
        self.writer.add_text("config", _code(json.dumps(config, indent=2, default=str)), 0)

    def write_summary(self, text: str) -> None:
        self.writer.add_text("model/summary", _code(text), 0)

    def write_dataset(self, description: dict[str, Any]) -> None:
        lines = ["| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in description.items())]
        self.writer.add_text("dataset", "\n".join(lines), 0)

    def write_predictions(self, table: Predictions, step: int) -> None:
        self.writer.add_text("predictions", predictions_markdown(table), step)
        if table.images is not None:
            self.writer.add_images("predictions/inputs", table.images, step, dataformats="NHWC")

    def write_model(self, path: Path) -> None:
        shutil.copyfile(path, Path(self.writer.log_dir) / "model.safetensors")

    def close_run(self, failed: bool) -> None:
        self.writer.close()


def _code(text: str) -> str:
    """``text`` as a Markdown code block (TensorBoard's text panel renders Markdown)."""
    return "\n".join("    " + line for line in text.splitlines())
