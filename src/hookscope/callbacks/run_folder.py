"""RunFolder: one callback gives any ``Learner.fit`` the run folder and the self-contained ``report.html``.

    learn = hs.Learner(model, dls, loss_func, cbs=[hs.callbacks.Doctor(), hs.callbacks.RunFolder("runs/a")])
    learn.fit(5)          # runs/a/report.html

The folder holds ``config.json`` (options, command, versions, times, status), ``metrics.csv/.jsonl`` (a
:class:`MetricsLogger`), ``summary.txt/.json``, ``findings.json``, ``timing.json`` and ``stats.json`` (when a
Doctor or ActivationStats ran), ``preflight.json`` (when ``hs.preflight`` ran before the fit),
``pruning.json`` (when a Pruning callback ran), ``figures/*.png`` (curves, statistics, gradient flow, feature
maps of the first convolutions), ``checkpoints/`` when asked, and ``report.html``. It is written under the
hidden name ``.<name>.partial`` and renamed into place when the fit ends (see :mod:`hookscope.staged_folder`);
a fit that fails or is interrupted keeps the partial folder, with a report saying where it stopped, and
``fit(n, resume=<folder>)`` with the same callback continues it. ``hookscope train`` is this callback around a
Learner.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
import warnings
from collections.abc import Mapping
from html import escape
from pathlib import Path
from typing import Any

from hookscope.atomic import atomic_write_json, atomic_write_text
from hookscope.callbacks.checkpoint import Checkpoint
from hookscope.callbacks.doctor import Doctor
from hookscope.callbacks.layer_stats import layer_statistics
from hookscope.callbacks.loggers.metrics import MetricsLogger
from hookscope.callbacks.progress import in_notebook
from hookscope.callbacks.pruning import Pruning
from hookscope.doctor.findings import Finding
from hookscope.doctor.recorders import ActivationRecorder, GradientRecorder
from hookscope.hooks.batch import split_batch
from hookscope.hooks.summary import summary
from hookscope.hooks.tensors import map_tensors
from hookscope.run_history import write_history
from hookscope.run_reader import Run
from hookscope.run_writer import (
    KIND,
    now_iso,
    summary_record,
    versions,
    write_findings,
    write_or_warn,
    write_report_html,
    write_stats,
    write_timing,
)
from hookscope.staged_folder import CONFIG, StagedFolder, read_json
from hookscope.train.callback import Callback


class RunFolder(Callback):
    """Write everything about a fit into the folder ``path`` and finish with ``report.html``.

    ``config``: the run's options as you name them (hyperparameters, data name...), kept in config.json
    next to what the Learner tells (model, loss, optimizer, lr, epochs, batch size, callbacks).
    ``command``: the command line to show (default: this process's). ``checkpoints``: ``True`` adds a
    :class:`Checkpoint` writing to ``<path>/checkpoints``, a mapping passes its keyword arguments
    (``{"monitor": "valid_loss"}``). ``metrics_every``: step rows in ``metrics.csv`` every so many steps
    (0: epochs only). ``figures=False`` skips matplotlib (the report then has tables only).

    Nothing is lost (:mod:`hookscope.staged_folder`): a ``path`` that hookscope did not write, or the
    folder you are in, is refused here; at ``fit`` an existing run at ``path`` is replaced only with
    ``overwrite=True``, and an unfinished one is resumed (``fit(n, resume=...)``), never deleted, unless
    ``overwrite=True``. From ``before_fit`` until :meth:`publish` the run is locked: a second writer
    there — in this process or another — is refused, also with ``overwrite=True``. ``publish=False``
    leaves the folder under its partial name at the end of the fit until :meth:`publish` is called (the
    command line publishes after its closing message). Refusals are
    :class:`~hookscope.staged_folder.RunFolderError`.
    """

    order = 110  # after every other callback at after_fit: the folder is renamed once all is written
    # Under torchrun rank 0 writes the folder; the Checkpoint part runs on every rank (each rank's RNGs
    # go into the file, which rank 0 writes).
    rank_zero_only = True
    run_during_sweep = False  # an lr_find sweep writes nothing

    def __init__(
        self,
        path: str | Path,
        config: Mapping[str, Any] | None = None,
        command: str | None = None,
        checkpoints: bool | Mapping[str, Any] = False,
        metrics_every: int = 10,
        figures: bool = True,
        overwrite: bool = False,
        publish: bool = True,
    ) -> None:
        self.final, self.partial = StagedFolder.paths(path)
        self.lock = StagedFolder.lock_for(self.final)  # held from before_fit until publish (or a failure)
        StagedFolder.check_owner(self.final, KIND)  # refused now, before anything loads or trains
        self.overwrite, self.publish_at_end = overwrite, publish
        self.config = dict(config or {})
        self.command = command if command is not None else process_command()
        self.figures = figures
        self.metrics = MetricsLogger(self.partial, every=metrics_every)
        self.metrics.rank_zero_only = True
        self.checkpoint: Checkpoint | None = None
        if checkpoints:
            options = dict(checkpoints) if isinstance(checkpoints, Mapping) else {}
            # the run's lock covers its checkpoints: taken by the Checkpoint, which runs first at before_fit
            self.checkpoint = Checkpoint(self.partial / "checkpoints", **{"lock": self.lock, **options})
        self.folder: StagedFolder | None = None
        self._sample: Any = None
        self._previous: dict[str, Any] = {}
        self._start, self._started = time.perf_counter(), now_iso()
        self._cancelled = False
        # where each tracker callback (TensorBoard, W&B, MLflow) writes, for config.json and the report
        self.trackers: dict[str, dict[str, str]] = {}
        # what hs.preflight found before the fit, for preflight.json and the report: set by whoever ran
        # it (the command line); else a Doctor(preflight=True)'s
        self.preflight: list[Finding] | None = None

    @property
    def companions(self) -> list[Callback]:
        """The MetricsLogger and the Checkpoint (when asked), added to the Learner beside this callback:
        they write into the folder."""
        return [cb for cb in (self.metrics, self.checkpoint) if cb is not None]

    @property
    def path(self) -> Path:
        """Where the files are now: the partial folder during the fit, the final one after it."""
        return self.folder.path if self.folder is not None else self.final

    def _repr_html_(self) -> str:
        """In a notebook, ``learn.run_folder`` shows the run inline: status, findings, then report.html."""
        if not self.path.is_dir():
            return f"<p>No run folder yet at <code>{escape(str(self.path))}</code>: the fit writes it.</p>"
        return Run(self.path)._repr_html_()

    # ---- events ----------------------------------------------------------------------------------------

    def before_fit(self) -> None:
        self._start, self._started, self._cancelled = time.perf_counter(), now_iso(), False
        self.folder = self._stage()
        self._previous = _read_config(self.folder.path)
        self._write_config("running")
        self._sample = self._one_sample()
        write_or_warn("the model summary", self._write_summary)

    def after_cancel_fit(self) -> None:
        self._cancelled = True

    def after_fit(self) -> None:
        self._write_results("stopped early" if self._cancelled else "complete")
        if self.publish_at_end:
            self.publish()

    def on_failure(self, exc: BaseException) -> None:
        """Keep the partial folder, with a report saying where the fit stopped and why; the run's lock is
        given back (the run can be resumed)."""
        if self.folder is not None:
            status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
            self._write_results(status, error=f"{type(exc).__name__}: {exc}")
        self.lock.release()

    def publish(self) -> Path:
        """Rename the finished run into place (replacing the run it may replace); returns its path.

        Callbacks with a ``run_folder_moved(old, new)`` method are told (a tracker store that keeps
        absolute paths, MLflow's, follows the folder)."""
        old = self.folder.path
        final = self.folder.finish()
        learn = getattr(self, "learn", None)
        for cb in learn.cbs if learn is not None else ():
            moved = getattr(cb, "run_folder_moved", None)
            if moved is not None:
                write_or_warn(f"{type(cb).__name__}'s paths", lambda moved=moved: moved(old, final))
        return final

    def mark_failed(self, reason: str) -> None:
        """Record in config.json and the report that the run is not a success (``reason``), after a fit
        that ended normally; the folder stays partial. For callers with their own verdict (the CLI:
        the doctor found errors)."""
        self._write_config("failed", error=reason)
        write_or_warn("report.html", self._write_report)
        self.lock.release()

    # ---- writing ---------------------------------------------------------------------------------------

    def _stage(self) -> StagedFolder:
        """A fresh folder, or the run this fit continues (see :meth:`_continued`)."""
        continued = self._continued()
        if continued is None:
            return StagedFolder.start(self.final, KIND, overwrite=self.overwrite, lock=self.lock)
        return StagedFolder.resume(continued, lock=self.lock)

    def _continued(self) -> Path | None:
        """The folder of the run this fit continues; None for a fresh run.

        Resuming: the folder holding the checkpoint, else (a checkpoint from elsewhere) this run's
        unfinished or finished folder. Fitting again: the folder of this callback's previous fit.
        """
        resumed = self.learn.resumed_from
        if resumed is None:
            return self.folder.path if self.folder is not None else None
        resumed = Path(os.path.abspath(resumed.expanduser()))
        holding = next((f for f in (self.partial, self.final) if f in resumed.parents), None)
        existing = next((f for f in (self.partial, self.final) if (f / CONFIG).is_file()), None)
        return holding or existing

    def _write_results(self, status: str, error: str | None = None) -> None:
        doctor = _first(self.learn, Doctor)
        if doctor is not None:
            write_or_warn("findings.json", lambda: self._write_findings(doctor))
            write_or_warn("timing.json", lambda: write_timing(self.folder.file, doctor.timing))
        statistics = layer_statistics(self.learn)
        activations = statistics.activations
        if activations is not None:
            write_or_warn("stats.json", lambda: self._write_stats(activations))
        losses, lrs = self.learn.recorder.losses, self.learn.recorder.lrs
        write_or_warn(
            "history.json",
            lambda: write_history(self.folder.file, losses, lrs, activations, statistics.gradients),
        )
        preflight = (
            self.preflight if self.preflight is not None else getattr(doctor, "preflight_findings", None)
        )
        if preflight is not None:
            write_or_warn(
                "preflight.json", lambda: write_findings(self.folder.file, preflight, "preflight.json")
            )
        pruning = _first(self.learn, Pruning)
        if pruning is not None:
            write_or_warn(
                "pruning.json", lambda: atomic_write_json(self.folder.file("pruning.json"), pruning.record())
            )
        if self.figures:
            write_or_warn("the figures", lambda: self._write_figures(activations, statistics.gradients))
        self._write_config(status, error)
        write_or_warn("report.html", self._write_report)

    def _write_config(self, status: str, error: str | None = None) -> None:
        """``config.json``: options, the Learner's facts, command, versions, times and — unless complete —
        where it stopped."""
        learn, previous = self.learn, self._previous
        elapsed = time.perf_counter() - self._start
        config: dict[str, Any] = {
            "name": self.final.name,
            "command": self.command,
            "commands": self._commands(),
            "options": self.config,
            "learner": learner_facts(learn),
            "versions": versions(),
            "started": previous.get("started", self._started),
            "status": status,
        }
        if status != "running":
            config["ended"] = now_iso()
            config["duration_s"] = previous.get("duration_s", 0.0) + elapsed
        if status not in ("running", "complete"):
            config["stopped_at"] = {
                "epoch": learn.epoch,
                "batch": learn.iter,
                "training_step": learn.training_step,
                "phase": "train" if learn.training else "validate",
            }
        if error is not None:
            config["error"] = error
        if learn.resumed_from is not None:
            config["resumed_from"] = str(learn.resumed_from)
        trackers = {**previous.get("trackers", {}), **self.trackers}
        if trackers:
            config["trackers"] = trackers
        atomic_write_json(self.folder.file(CONFIG), config)

    def _commands(self) -> list[str]:
        """The command of every part of the run: those of the runs it continues, then this one's."""
        previous = self._previous
        earlier = previous.get("commands") or ([previous["command"]] if "command" in previous else [])
        return [*earlier, self.command]

    def _one_sample(self) -> Any:
        """The inputs of one validation example (training when there is none): summary and feature maps."""
        dl = self.learn.dls.valid if self.learn.dls.valid is not None else self.learn.dls.train
        try:
            xb = split_batch(self.learn.one_batch(dl))[0]
        except Exception as err:
            warnings.warn(f"RunFolder: no sample for the summary and feature maps ({err})", stacklevel=2)
            return None
        return map_tensors(lambda t: t[:1], xb)

    def _write_summary(self) -> None:
        """``summary.txt`` as printed, ``summary.json`` as the report's table (one row per module call)."""
        if self._sample is None:
            return
        table = summary(self.learn.model, self._sample)
        atomic_write_text(self.folder.file("summary.txt"), str(table))
        atomic_write_json(self.folder.file("summary.json"), summary_record(table))

    def _write_findings(self, doctor: Doctor) -> None:
        write_findings(self.folder.file, doctor.findings)

    def _write_stats(self, activations: ActivationRecorder) -> None:
        write_stats(self.folder.file, activations.latest())

    def _write_figures(
        self, activations: ActivationRecorder | None, gradients: GradientRecorder | None
    ) -> None:
        from hookscope.viz.run_figures import write_run_figures  # matplotlib loads here, not with hookscope

        write_run_figures(self.learn, self.folder.file, activations, gradients, self._sample)

    def _write_report(self) -> None:
        write_report_html(self.folder.path)


def process_command() -> str:
    """This process's command as a run's config shows it; in a Jupyter kernel, whose command line is the
    ipykernel launcher, ``notebook`` and the notebook's path where Jupyter Server tells it."""
    if in_notebook():
        path = os.environ.get("JPY_SESSION_NAME")
        return shlex.join(["notebook", path]) if path else "notebook"
    return shlex.join(["python", *sys.argv]) if sys.argv and sys.argv[0] else "python (interactive)"


def learner_facts(learn: Any) -> dict[str, Any]:
    """What the Learner itself says about the run, for config.json and the report's cards."""
    return {
        "model": type(learn.model).__name__,
        "loss_func": _name(learn.loss_func),
        "opt_func": _name(learn.opt_func),
        "lr": learn.lr,
        "epochs": learn.n_epoch,
        "batch_size": getattr(learn.dls.train, "batch_size", None),
        "callbacks": [type(cb).__name__ for cb in learn.cbs],
    }


def _first(learn: Any, kind: type[Callback]) -> Any:
    """The first callback of type ``kind`` attached to ``learn``."""
    return next((cb for cb in learn.cbs if isinstance(cb, kind)), None)


def _read_config(folder: Path) -> dict[str, Any]:
    """The config of the run being continued (nothing for a fresh one)."""
    path = folder / CONFIG
    return read_json(path) if path.is_file() else {}


def _name(obj: Any) -> str:
    return getattr(obj, "__name__", None) or type(obj).__name__
