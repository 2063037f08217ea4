"""The tracker base class: what is logged and when; each tracker only says how to write it.

Rates are bounded and reads are batched: every ``every``-th optimizer step keeps a reference to its
(device) loss, and every ``read_every`` steps (and at each epoch's end) the kept losses are read in ONE
transfer and written together with the statistics and the doctor's new findings. The statistics come
from the ActivationStats / GradientStats already attached, or a :class:`~hookscope.callbacks.Doctor`
(found with :func:`~hookscope.callbacks.layer_stats.layer_statistics`): their histograms are computed
on the device and read in their own bulk transfers; a tracker adds no hook and no statistic of its own.
Scalars are logged at most every ``stats_every`` steps, histograms every ``hist_every`` steps; the
doctor's timing of the steps (``time/data``, ``time/forward``... ``time/step``, seconds) at the same rate.

A tracker never stops training: one that cannot import its library, start, or write is reported once as
a warning naming the tracker and the cause, and is off for the rest of the fit; what it wrote is kept.

Steps are 0-based optimizer steps: step ``s`` is the step whose batch started with
``learn.training_step == s``, the step the doctor's findings and the statistics are keyed by.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hookscope.callbacks.layer_stats import ParamRecord, layer_statistics
from hookscope.callbacks.trackers.records import (
    Predictions,
    Rows,
    activation_values,
    add_row,
    at_steps,
    dataset_description,
    learner_config,
    module_gradients,
    sample_predictions,
    since,
    spaced,
)
from hookscope.doctor.findings import Finding
from hookscope.hooks.stats import TensorStats
from hookscope.train.callback import Callback

INSTALL_HINT = "pip install 'hookscope[trackers]'"


class TrackerWarning(UserWarning):
    """A tracker could not start or write; training and the run folder went on without it."""


class Tracker(Callback, ABC):
    """Log a fit to an experiment tracker at a bounded rate (see the module docstring).

    ``every``: one training-loss (and learning-rate) point per so many optimizer steps. ``read_every``:
    steps between reads (one transfer each). ``stats_every`` / ``hist_every``: spacing of the logged
    statistics scalars / histograms. ``log_preds``: a table of predictions on the first validation
    batch at the end of the fit (with the images when the inputs are images; ``n_preds`` rows).
    ``log_model``: the final weights as a safetensors artifact. ``log_dataset``: the data's description
    and sizes. ``config``: more settings to record with the run's own.
    """

    order = 80  # after the Recorder, schedulers and statistics; before Checkpoint (so it saves our ids)
    run_valid = False
    label = "tracker"  # the tracker's name in warnings and in the run folder's report
    run_during_sweep = False  # an lr_find sweep is not the run's

    def __init__(
        self,
        every: int = 10,
        read_every: int = 100,
        stats_every: int = 50,
        hist_every: int = 100,
        log_preds: bool = True,
        log_model: bool = False,
        log_dataset: bool = False,
        n_preds: int = 16,
        config: dict[str, Any] | None = None,
    ) -> None:
        rates = {
            "every": every,
            "read_every": read_every,
            "stats_every": stats_every,
            "hist_every": hist_every,
        }
        bad = {k: v for k, v in rates.items() if not isinstance(v, int) or v < 1}
        if bad or n_preds < 1:
            raise ValueError(
                f"{type(self).__name__}: {bad or {'n_preds': n_preds}} must be integers >= 1 (steps between "
                "logged points, rows of the predictions table)"
            )
        self.every, self.read_every = every, read_every
        self.stats_every, self.hist_every = stats_every, hist_every
        self.log_preds, self.log_model, self.log_dataset = log_preds, log_model, log_dataset
        self.n_preds = n_preds
        self.config = dict(config or {})
        self.run_id: str | None = None  # the tracker's own id of the run, kept in checkpoints
        self.location: str | None = None  # where it wrote, for the report
        self.failure: str | None = None  # why it stopped logging, when it did
        self._findings_logged = 0
        self._stats_last: int | None = None
        self._hist_last: int | None = None
        self._timing_last: int | None = None
        self._active = self._off = False
        self._pending: list[tuple[int, torch.Tensor, list[Any]]] = []
        self._last_step = self._read_at = 0
        self._scratch: tempfile.TemporaryDirectory[str] | None = None

    @property
    def name(self) -> str:
        """``learn.<name>``, its state's key in checkpoints: ``tensorboard``, ``wandb`` or ``mlflow``."""
        return type(self).__name__.removesuffix("Callback").lower()

    # ---- what a tracker implements ---------------------------------------------------------------------

    @abstractmethod
    def open_run(self, folder: Path) -> str:
        """Start (or, when ``self.run_id`` is set, continue) the run, writing under ``folder`` unless told
        otherwise; set ``self.run_id``; return where it writes (relative to ``folder`` when inside)."""

    @abstractmethod
    def how_to_open(self, location: str) -> str:
        """The command that shows the run, from the run folder (for the report)."""

    @abstractmethod
    def write_scalars(self, rows: Rows) -> None:
        """Write ``{step: {key: value}}``."""

    def write_histograms(self, step: int, histograms: dict[str, TensorStats]) -> None:
        """Write the histogram of each ``tag`` at ``step`` (bins and counts from the device statistics);
        a tracker without histograms (MLflow) keeps this no-op."""

    @abstractmethod
    def write_findings(self, new: list[Finding], every: list[Finding]) -> None:
        """Write the doctor's ``new`` findings (``every`` holds all of them so far)."""

    @abstractmethod
    def write_config(self, config: dict[str, Any]) -> None:
        """Record the run's configuration and hyperparameters."""

    @abstractmethod
    def write_summary(self, text: str) -> None:
        """Record the model summary table (as printed)."""

    @abstractmethod
    def write_dataset(self, description: dict[str, Any]) -> None:
        """Record the data's description and sizes."""

    @abstractmethod
    def write_predictions(self, table: Predictions, step: int) -> None:
        """Record the sample predictions table (and images) at ``step``."""

    @abstractmethod
    def write_model(self, path: Path) -> None:
        """Store the safetensors file at ``path`` (a temporary file) as the run's model."""

    @abstractmethod
    def close_run(self, failed: bool) -> None:
        """End the run (``failed``: the fit raised); flush what is buffered."""

    # ---- events ----------------------------------------------------------------------------------------

    def before_fit(self) -> None:
        # under torchrun only rank 0 logs (as it writes the run folder)
        self._off, self._active, self.failure = not _rank_zero(), False, None
        self._pending = []
        self._last_step = self._read_at = self.learn.training_step

    def before_epoch(self) -> None:
        # Started here, not in before_fit: the RunFolder (order 110) makes its folder in before_fit.
        if not (self._active or self._off):
            self._attempt("starting", self._start)

    def after_step(self) -> None:
        learn = self.learn
        step = learn.training_step
        if step == self._last_step or not self._active:
            return  # no optimizer step (accumulating, skipped by the scaler) or not logging
        self._last_step = step
        if (step - 1) % self.every == 0:
            self._pending.append((step - 1, learn.loss, [group["lr"] for group in learn.opt.param_groups]))
        if step - self._read_at >= self.read_every:
            self._attempt("logging", self._read)

    def after_epoch(self) -> None:
        if self._active:
            self._attempt("logging", self._read)
            self._attempt("logging the epoch", self._write_epoch)

    def after_fit(self) -> None:
        if not self._active:
            return
        self._attempt("logging", self._read)
        self._attempt("logging the results", self._write_results)
        if self._active:  # a failure above has closed the run already
            self._close(failed=False)

    def on_failure(self, exc: BaseException) -> None:
        """Keep what the fit logged until it failed, and mark the run as failed."""
        if not self._active:
            return
        self._attempt("logging", self._read)
        self._close(failed=True)

    # ---- checkpoint state ------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The run id (a resumed fit continues the same run) and what was already logged."""
        if self.run_id is None:
            return {}
        state: dict[str, Any] = {"run_id": self.run_id, "findings_logged": self._findings_logged}
        state.update(
            {
                k: v
                for k, v in (
                    ("stats_last", self._stats_last),
                    ("hist_last", self._hist_last),
                    ("timing_last", self._timing_last),
                )
                if v is not None
            }
        )
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.run_id = state["run_id"]
        self._findings_logged = state["findings_logged"]
        self._stats_last, self._hist_last = state.get("stats_last"), state.get("hist_last")
        self._timing_last = state.get("timing_last")

    # ---- the work --------------------------------------------------------------------------------------

    def _start(self) -> None:
        learn, folder = self.learn, self.run_folder()
        continuing = self.run_id is not None
        self.location = self.open_run(folder.path if folder is not None else Path.cwd())
        self._active = True
        if folder is not None:
            folder.trackers[self.label] = {"path": self.location, "open": self.how_to_open(self.location)}
        if continuing:
            return  # the run already holds its configuration, summary and data description
        options = {"options": dict(folder.config)} if folder is not None and folder.config else {}
        self.write_config(learner_config(learn, {**options, **self.config}))
        self.write_summary(_summary_text(learn))
        if self.log_dataset:
            self.write_dataset(dataset_description(learn))

    def _read(self) -> None:
        """Read what is pending (losses in one transfer; statistics from their histories) and write it."""
        self._read_at = self.learn.training_step
        rows: Rows = {}
        self._take_losses(rows)
        self._take_timing(rows)
        histograms = self._take_stats(rows)
        if rows:
            self.write_scalars(rows)
        for step in sorted(histograms):
            self.write_histograms(step, histograms[step])
        self._take_findings()

    def _take_losses(self, rows: Rows) -> None:
        pending, self._pending = self._pending, []
        if not pending:
            return
        losses = torch.stack([loss.detach().float().reshape(()) for _, loss, _ in pending]).tolist()
        for (step, _, lrs), loss in zip(pending, losses, strict=True):
            values = {"train/loss": loss}
            if len(lrs) == 1:
                values["train/lr"] = float(lrs[0])
            else:
                values.update({f"train/lr_{i}": float(lr) for i, lr in enumerate(lrs)})
            add_row(rows, step, values)

    def _take_timing(self, rows: Rows) -> None:
        """``time/<phase>`` seconds of the steps the doctor timed since the last read, ``stats_every``
        apart (host numbers the doctor read at its checks)."""
        timing = getattr(getattr(self.learn, "doctor", None), "timing", None)
        for step, values in timing.scalars_since(self._timing_last, self.stats_every) if timing else ():
            add_row(rows, step, values)
            self._timing_last = step

    def _take_stats(self, rows: Rows) -> dict[int, dict[str, TensorStats]]:
        """Add the statistics scalars due to ``rows``; return the histograms due, by step."""
        statistics = layer_statistics(self.learn)
        activations, gradients = statistics.activations, statistics.gradients
        acts = activations.history if activations is not None else {}
        outs = gradients.history if gradients is not None else {}  # empty without output_grads
        params = gradients.param_history if gradients is not None else {}
        scalar_steps = self._due([acts, outs, params], "_stats_last", self.stats_every)
        for layer, record in at_steps(acts, scalar_steps):
            add_row(
                rows, record.step, {f"{k}/{layer}": v for k, v in activation_values(record.stats).items()}
            )
        for layer, record in at_steps(outs, scalar_steps):
            add_row(rows, record.step, {f"grad_std/{layer}": record.stats.std})
        by_step: dict[int, dict[str, ParamRecord]] = {}
        for param, record in at_steps(params, scalar_steps):
            by_step.setdefault(record.step, {})[param] = record
        for step, records in by_step.items():
            add_row(rows, step, module_gradients(records))
        histograms: dict[int, dict[str, TensorStats]] = {}
        hist_steps = self._due([acts, outs], "_hist_last", self.hist_every)
        for group, history in (("activations", acts), ("gradients", outs)):
            for layer, record in at_steps(history, hist_steps):
                histograms.setdefault(record.step, {})[f"{group}/{layer}"] = record.stats
        return histograms

    def _due(self, histories: list[dict[str, Any]], mark: str, spacing: int) -> set[int]:
        """The steps to log from ``histories`` now (``spacing`` apart, after the step in ``self.<mark>``)."""
        last = getattr(self, mark)
        steps = [
            r.step for history in histories for records in history.values() for r in since(records, last)
        ]
        chosen = spaced(steps, last, spacing)
        if chosen:
            setattr(self, mark, chosen[-1])
        return set(chosen)

    def _take_findings(self) -> None:
        doctor = getattr(self.learn, "doctor", None)
        findings = list(getattr(doctor, "findings", []))
        new = findings[self._findings_logged :]
        if new:
            self.write_findings(new, findings)
            self._findings_logged = len(findings)

    def _write_epoch(self) -> None:
        row = self.learn.recorder.history[-1]
        values = {f"epoch/{k}": float(v) for k, v in row.items() if k not in ("epoch", "time")}
        values["epoch"] = float(row["epoch"] + 1)  # epochs done, as a progress axis
        self.write_scalars({max(self.learn.training_step - 1, 0): values})

    def _write_results(self) -> None:
        step = max(self.learn.training_step - 1, 0)
        table = sample_predictions(self.learn, self.n_preds) if self.log_preds else None
        if table is not None:
            self.write_predictions(table, step)
        if self.log_model:
            from hookscope.train.checkpoint.export import export_safetensors

            # kept until the run is closed: a library may read the file after write_model returns
            self._scratch = tempfile.TemporaryDirectory(prefix="hookscope-model-")
            self.write_model(
                export_safetensors(self.learn.model, Path(self._scratch.name) / "model.safetensors")
            )

    def _close(self, failed: bool) -> None:
        self._active = False
        try:
            self.close_run(failed)
        except Exception as err:
            self._give_up("closing the run", err)
        finally:
            if self._scratch is not None:
                self._scratch.cleanup()
                self._scratch = None

    def _attempt(self, what: str, action: Callable[[], None]) -> None:
        """Run one tracker action; the first failure warns once and turns this tracker off for the fit."""
        if self._off:
            return
        try:
            action()
        except Exception as err:
            self._give_up(what, err)

    def _give_up(self, what: str, err: Exception) -> None:
        was_active, self._active, self._off = self._active, False, True
        self.failure = f"{what} failed: {type(err).__name__}: {err}"
        warnings.warn(
            f"{type(self).__name__}: {what} failed ({type(err).__name__}: {err}); {self.label} logging is "
            "off for the rest of this fit — training and the run folder go on",
            TrackerWarning,
            stacklevel=2,
        )
        if was_active:
            with contextlib.suppress(Exception):  # already reported: closing is best effort
                self.close_run(failed=True)

    def run_folder(self) -> Any:
        """The fit's RunFolder callback, when there is one (trackers then write inside its folder)."""
        from hookscope.callbacks.run_folder import RunFolder

        return self._first(RunFolder)

    def _first(self, kind: type[Callback]) -> Any:
        return next((cb for cb in self.learn.cbs if isinstance(cb, kind)), None)


def _summary_text(learn: Any) -> str:
    """The model summary as printed; a model the summary cannot trace still gets its run logged."""
    try:
        return str(learn.summary())
    except Exception as err:
        return f"(no summary: {type(err).__name__}: {err})"


def _rank_zero() -> bool:
    dist = torch.distributed
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def require(module: str, tracker: str) -> Any:
    """Import a tracker's library, or raise ImportError with the install hint."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(f"{tracker} needs {module} ({err}); {INSTALL_HINT}") from err


def relative_to(path: Path, folder: Path) -> str:
    """``path`` relative to ``folder`` when inside it (a run folder is renamed at its end), else absolute."""
    path, folder = Path(os.path.abspath(path)), Path(os.path.abspath(folder))
    return str(path.relative_to(folder)) if folder in path.parents or path == folder else str(path)
