"""WandbCallback: a fit in Weights & Biases, with fastai's argument names (``log_preds``, ``log_model``,
``log_dataset``) and meanings; offline unless configured.

Everything is logged against a ``global_step`` axis (the optimizer step), so values that arrive late —
statistics read in bulk, findings — land at their own step. Histograms are W&B histograms built from the
bins counted on the device (no host-side ``np.histogram`` per layer, no sync per layer). The doctor's
findings become a ``doctor/findings`` table, the run's notes and ``doctor:<kind>`` tags. The model
summary is a run file, the dataset description a ``dataset`` artifact, the final weights a ``model``
artifact holding ``model.safetensors``, the sample predictions a table with the images.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hookscope.callbacks.trackers.base import Tracker, relative_to, require
from hookscope.callbacks.trackers.records import Predictions, Rows, as_uint8, findings_markdown
from hookscope.doctor.findings import Finding
from hookscope.hooks.stats import TensorStats

STEP = "global_step"
FINDING_COLUMNS = ["step", "module", "kind", "severity", "message"]


class WandbCallback(Tracker):
    """Log the fit to a W&B run (the article's ``WandbCallback(log_preds=True, log_model=True,
    log_dataset=True)`` works as written).

    ``mode=None`` uses ``WANDB_MODE`` when set, else ``"offline"``: nothing leaves the machine until you
    run ``wandb sync``. ``project`` defaults to ``"hookscope"``. Files go under ``dir`` (default: the run
    folder when a :class:`~hookscope.callbacks.RunFolder` is attached, else the working directory), in
    W&B's own ``wandb/`` layout. A run the user already started with ``wandb.init()`` is used, and left
    open at the end, as fastai does. ``init_kwargs`` go to ``wandb.init`` (``entity``, ``name``, ``tags``,
    ``settings``...). Rates: see :class:`~hookscope.callbacks.trackers.base.Tracker`.
    """

    label = "W&B"

    def __init__(
        self,
        log_preds: bool = True,
        log_model: bool = True,
        log_dataset: bool = False,
        project: str | None = None,
        mode: str | None = None,
        dir: str | Path | None = None,
        n_preds: int = 16,
        init_kwargs: dict[str, Any] | None = None,
        **rates: Any,
    ) -> None:
        super().__init__(
            log_preds=log_preds, log_model=log_model, log_dataset=log_dataset, n_preds=n_preds, **rates
        )
        self.project, self.mode, self.dir = project, mode, dir
        self.init_kwargs = dict(init_kwargs or {})
        self.run: Any = None
        self._own = True

    def open_run(self, folder: Path) -> str:
        wandb = require("wandb", type(self).__name__)
        root = Path(self.dir) if self.dir is not None else folder
        if wandb.run is not None and self.run_id in (None, wandb.run.id):
            self.run, self._own = wandb.run, False  # the user's own run (fastai's way): used, left open
        else:
            self.run, self._own = self._init(wandb, root), True
        self.run_id = self.run.id
        self.run.define_metric(STEP)
        self.run.define_metric("*", step_metric=STEP)
        return relative_to(Path(self.run.dir).parent, folder)

    def _init(self, wandb: Any, root: Path) -> Any:
        root.mkdir(parents=True, exist_ok=True)
        options: dict[str, Any] = {
            "project": self.project or "hookscope",
            "dir": str(root),
            "mode": self.mode or os.environ.get("WANDB_MODE") or "offline",
            "reinit": "create_new",  # never finish a run someone else started
            "settings": wandb.Settings(silent=True, console="off"),
        }
        if self.run_id is not None:  # a resumed fit continues the same run
            options.update(id=self.run_id, resume="allow")
        return wandb.init(**{**options, **self.init_kwargs})

    def how_to_open(self, location: str) -> str:
        offline = getattr(self.run.settings, "mode", "offline") in ("offline", "dryrun")
        return f"wandb sync {location}" if offline else str(self.run.url)

    def write_scalars(self, rows: Rows) -> None:
        for step in sorted(rows):
            self.run.log({STEP: step, **rows[step]})

    def write_histograms(self, step: int, histograms: dict[str, TensorStats]) -> None:
        import wandb

        entries = {
            tag: wandb.Histogram(np_histogram=(stats.histogram.tolist(), stats.edges.tolist()))
            for tag, stats in histograms.items()
        }
        self.run.log({STEP: step, **entries})

    def write_findings(self, new: list[Finding], every: list[Finding]) -> None:
        import wandb

        rows = [[f.step, f.module, f.kind, f.severity, f.message] for f in every]
        table = wandb.Table(columns=FINDING_COLUMNS, data=rows)
        self.run.log({STEP: max(f.step for f in new), "doctor/findings": table})
        self.run.notes = "Doctor findings:\n" + findings_markdown(every)
        kinds = {f"doctor:{f.kind}" for f in every}
        self.run.tags = tuple(sorted(set(self.run.tags or ()) | kinds))

    def write_config(self, config: dict[str, Any]) -> None:
        self.run.config.update(config, allow_val_change=True)

    def write_summary(self, text: str) -> None:
        path = Path(self.run.dir) / "model_summary.txt"
        path.write_text(text, encoding="utf-8")
        self.run.save(str(path), base_path=self.run.dir, policy="now")

    def write_dataset(self, description: dict[str, Any]) -> None:
        import wandb

        self.run.config.update({"dataset": description}, allow_val_change=True)
        artifact = wandb.Artifact(f"dataset-{self.run.id}", type="dataset", metadata=description)
        with artifact.new_file("dataset.json", encoding="utf-8") as f:
            json.dump(description, f, indent=2)
        self.run.log_artifact(artifact)

    def write_predictions(self, table: Predictions, step: int) -> None:
        import wandb

        columns, rows = list(table.columns), [list(row) for row in table.rows]
        if table.images is not None:
            columns.insert(0, "image")
            for row, image in zip(rows, table.images, strict=True):
                row.insert(0, wandb.Image(as_uint8(image)))
        self.run.log({STEP: step, "predictions": wandb.Table(columns=columns, data=rows)})

    def write_model(self, path: Path) -> None:
        import wandb

        artifact = wandb.Artifact(f"model-{self.run.id}", type="model", metadata={"format": "safetensors"})
        artifact.add_file(str(path), name="model.safetensors")
        self.run.log_artifact(artifact, aliases=["latest"])

    def close_run(self, failed: bool) -> None:
        if self._own:
            self.run.finish(exit_code=1 if failed else 0)
