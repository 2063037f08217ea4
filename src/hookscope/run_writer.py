"""The files of a run folder, written by the ``RunFolder`` callback and by ``hs.watch(..., path=)``.

Both write the same ``findings.json``, ``stats.json``, ``timing.json``, ``summary.json``, ``config.json``
facts and ``report.html`` (the layout is in :mod:`hookscope.staged_folder`). This module sits beside
``staged_folder`` so that ``hs.watch`` writes a run folder without depending on the callbacks: it uses
``hooks`` and ``doctor`` at import time, and ``viz`` (matplotlib) only inside the functions that draw.
"""

from __future__ import annotations

import platform
import shlex
import sys
import warnings
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from hookscope.atomic import atomic_write_json
from hookscope.doctor.findings import Finding, ranked
from hookscope.doctor.record_types import StepStats
from hookscope.doctor.recorders import ActivationRecorder, GradientRecorder
from hookscope.doctor.timing import TimingRecorder
from hookscope.folder_lock import FolderLock
from hookscope.hooks.summary import Summary
from hookscope.run_history import write_history
from hookscope.staged_folder import CONFIG, StagedFolder

KIND = "train"  # the marker kind of a run folder (hookscope inspect writes "inspect" folders)


def write_findings(file: Callable[[str], Path], findings: list[Finding], name: str = "findings.json") -> None:
    """``findings.json`` (or ``name``): every finding, most severe first."""
    atomic_write_json(file(name), [f.to_dict() for f in ranked(findings)])


def write_stats(file: Callable[[str], Path], latest: Mapping[str, StepStats]) -> None:
    """``stats.json``: the last recorded activation statistics of every watched layer."""
    rows = [
        {
            "layer": name,
            "step": record.step,
            "mean": record.stats.mean,
            "std": record.stats.std,
            "dead_units": record.stats.dead_fraction(),
            "non_finite": record.stats.nonfinite,
            "abs_max": record.stats.abs_max,
            "zeros": record.stats.zero_fraction,
            "sampled": record.stats.sampled,
        }
        for name, record in latest.items()
    ]
    atomic_write_json(file("stats.json"), rows)


def write_timing(file: Callable[[str], Path], timing: TimingRecorder) -> None:
    """``timing.json``: where the training time went and memory over the run (see
    :meth:`~hookscope.doctor.timing.TimingRecorder.record`); nothing when no step was timed."""
    if timing.steps_read:
        atomic_write_json(file("timing.json"), timing.record())


def write_watch_folder(
    path: str | Path,
    config: Mapping[str, Any],
    findings: list[Finding],
    activations: ActivationRecorder | None,
    gradients: GradientRecorder | None,
    losses: list[float],
    model: torch.nn.Module,
    timing: TimingRecorder | None = None,
    lock: FolderLock | None = None,
) -> Path:
    """The run folder of an ``hs.watch`` (no Learner): config.json (``config`` plus name, command and
    versions), findings.json, stats.json, timing.json, history.json, the loss and statistics figures and
    report.html; returns the published folder. An existing run at ``path`` is refused, as by RunFolder
    without ``overwrite``, and so is a run another live writer is writing there. ``lock``: the run's writer
    lock when the caller took it at the run's start (released here)."""
    folder = StagedFolder.start(path, KIND, lock=lock)  # holds the run's lock till finished
    try:
        command = shlex.join(["python", *sys.argv])
        facts = {"name": folder.final.name, "command": command, "versions": versions()}
        atomic_write_json(folder.file(CONFIG), {**facts, **config, "ended": now_iso()})
        write_or_warn("findings.json", lambda: write_findings(folder.file, findings))
        if activations is not None:
            write_or_warn("stats.json", lambda: write_stats(folder.file, activations.latest()))
        if timing is not None:
            write_or_warn("timing.json", lambda: write_timing(folder.file, timing))
        write_or_warn("history.json", lambda: write_history(folder.file, losses, [], activations, gradients))
        write_or_warn(
            "the figures", lambda: _write_watch_figures(folder.file, losses, activations, gradients, model)
        )
        write_or_warn("report.html", lambda: write_report_html(folder.path))
        return folder.finish()
    finally:
        folder.release()


def _write_watch_figures(
    file: Callable[[str], Path],
    losses: list[float],
    activations: ActivationRecorder | None,
    gradients: GradientRecorder | None,
    model: torch.nn.Module,
) -> None:
    from hookscope.viz.curves import loss_curves  # matplotlib loads here, not with hookscope
    from hookscope.viz.run_figures import write_statistics_figures
    from hookscope.viz.save import save_figure

    if losses:
        save_figure(loss_curves(losses, []), file("figures/loss.png"))
    write_statistics_figures(model, file, activations, gradients)


def write_report_html(folder: Path) -> None:
    """``report.html`` from the files of ``folder``; the viz module loads here, not with hookscope."""
    from hookscope.viz.report import write_report

    write_report(folder)


def summary_record(table: Summary) -> dict[str, Any]:
    """The summary as the report's table: totals and one row per named module call."""
    rows = [
        {
            "layer": "\u2003" * (row.depth - 1) + row.name,
            "type": row.type,
            "output_shape": ", ".join("×".join(map(str, s)) for s in row.output_shapes),
            "params": row.params,
            "MACs": row.macs,
        }
        for row in table.rows
        if row.name
    ]
    totals = {k: getattr(table, k) for k in ("total_params", "trainable_params", "total_macs")}
    return {**totals, "rows": rows}


def versions() -> dict[str, str]:
    """Versions of what shapes a run's numbers: Python, hookscope, torch, torchvision, numpy, platform."""
    import numpy as np

    from hookscope import __version__

    found = {
        "python": platform.python_version(),
        "hookscope": __version__,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "platform": platform.platform(),
    }
    try:
        import torchvision

        found["torchvision"] = torchvision.__version__
    except ImportError:
        found["torchvision"] = "not installed"
    return found


def write_or_warn(what: str, write: Callable[[], None]) -> None:
    """Write one artifact; a failure warns and the rest of the folder is still written."""
    try:
        write()
    except Exception as err:
        warnings.warn(f"run folder: could not write {what} ({type(err).__name__}: {err})", stacklevel=2)


def now_iso() -> str:
    """Now, in UTC, as config.json writes times."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
