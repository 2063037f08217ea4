"""Optuna pruning that also listens to the doctor: a trial the doctor has diagnosed stops at once.

Optuna's own callbacks (``PyTorchLightningPruningCallback``, ``FastAIPruningCallback``) prune on one
monitored number: they report it every epoch and let the study's pruner compare it with other trials.
:class:`DoctorPruning` does the same for a hookscope Learner, and also prunes the moment the doctor
raises an error-severity finding (the loss diverges, a value became NaN, gradients explode a
thousandfold...), recording that finding in the trial's user attributes (``doctor_finding``: kind,
module, step, message) so that the study says why::

    import optuna
    from hookscope.integrations.optuna import DoctorPruning

    def objective(trial):
        learn = hs.Learner(model(), dls, loss, lr=trial.suggest_float("lr", 1e-4, 10, log=True),
                           cbs=[hs.callbacks.Doctor()])
        learn.fit(5, cbs=[DoctorPruning(trial, monitor="valid_loss")])
        return learn.recorder.history[-1]["valid_loss"]

    optuna.create_study(pruner=optuna.pruners.MedianPruner()).optimize(objective, n_trials=20, n_jobs=4)

A pruned trial raises :class:`optuna.TrialPruned` from inside the fit, as Optuna's callbacks do in
their frameworks: the fit ends as a failure — the run folder keeps the trial's unfinished run with the
reason, trackers mark the run failed — and the study records the trial as pruned.

In a hand-written loop, :func:`watch_pruning` does the same for ``hs.watch``. Trials in parallel work
both ways Optuna runs them: threads of one process (``n_jobs``) and processes sharing an RDB (SQLite)
or journal storage; each trial needs its own run folder, checkpoint folder and tracker run names (see
docs/trackers.md).

This module imports Optuna when it is imported; hookscope never imports it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from hookscope.doctor.findings import Finding
from hookscope.integrations._common import missing_framework
from hookscope.train.callback import Callback

try:
    import optuna
except ImportError as err:
    raise missing_framework(__name__, "Optuna") from err

FINDING_ATTR = "doctor_finding"  # the trial's user attribute holding the finding that pruned it


def prune_on_findings(trial: optuna.Trial, findings: Iterable[Finding]) -> None:
    """Raise :class:`optuna.TrialPruned` when ``findings`` hold an error, recording the first (most
    severe by the doctor's order of arrival) in the trial's user attribute ``doctor_finding``."""
    error = next((f for f in findings if f.severity == "error"), None)
    if error is None:
        return
    trial.set_user_attr(
        FINDING_ATTR,
        {"kind": error.kind, "module": error.module, "step": error.step, "message": error.message},
    )
    where = f" in {error.module}" if error.module else ""
    raise optuna.TrialPruned(f"the doctor found {error.kind}{where} at step {error.step}: {error.message}")


def report(trial: optuna.Trial, value: float, step: int, monitor: str) -> None:
    """Report ``value`` at ``step`` and raise :class:`optuna.TrialPruned` when the study's pruner says so
    (a NaN is reported as infinity, so that every pruner ranks it worst)."""
    trial.report(value if not math.isnan(value) else math.inf, step)
    if trial.should_prune():
        raise optuna.TrialPruned(f"pruned by the study's pruner at epoch {step + 1}: {monitor}={value:.4g}")


class DoctorPruning(Callback):
    """Report ``monitor`` (a key of ``learn.recorder.history``) to ``trial`` after every epoch and prune
    when the study's pruner says so; prune at once on an error-severity finding of the Learner's
    :class:`~hookscope.callbacks.Doctor` (checked after every training batch), recording it in the
    trial's user attributes. Without a Doctor only the monitored value prunes.
    """

    order = 95  # after the Recorder (the epoch's values) and the Doctor (its checks of the step)
    run_valid = False
    run_during_sweep = False  # an lr_find sweep is not a trial's epoch

    def __init__(self, trial: optuna.Trial, monitor: str = "valid_loss") -> None:
        self.trial, self.monitor = trial, monitor
        self._seen = 0

    def before_fit(self) -> None:
        available = ["train_loss", "valid_loss", *self.learn.recorder.metric_names]
        if self.monitor not in available:
            raise KeyError(
                f"DoctorPruning: monitor={self.monitor!r} is not in learn.recorder.history "
                f"(available: {', '.join(available)}); pass one of those"
            )
        self._seen = len(self._findings())

    def after_batch(self) -> None:
        findings = self._findings()
        new, self._seen = findings[self._seen :], len(findings)
        prune_on_findings(self.trial, new)

    def after_epoch(self) -> None:
        self.after_batch()  # the epoch's validation may have found something too
        value = float(self.learn.recorder.history[-1][self.monitor])
        report(self.trial, value, self.learn.epoch, self.monitor)

    def _findings(self) -> list[Finding]:
        doctor = getattr(self.learn, "doctor", None)
        return list(getattr(doctor, "findings", []))


def watch_pruning(trial: optuna.Trial, watch: Any) -> Callable[[float, int], None]:
    """Prune a hand-written loop under ``hs.watch``: an error finding of ``watch`` raises
    :class:`optuna.TrialPruned` at the check that finds it (from the optimizer step, out of the loop,
    and ``watch`` closes as after any error); returns ``report(value, epoch)`` to call after each
    epoch with the monitored value, which the study's pruner judges."""
    watch.after_check.append(lambda findings: prune_on_findings(trial, findings))

    def report_epoch(value: float, epoch: int) -> None:
        report(trial, value, epoch, "value")

    return report_epoch
