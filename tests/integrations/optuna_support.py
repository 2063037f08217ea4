"""The sweep of the Optuna tests: a small MLP on the bundled digits whose learning rate is the trial's;
lr 10 with SGD is doomed (the loss diverges within a few steps, an error finding), lr 0.1 learns. Every
trial writes its own run folder and logs to the MLflow store and TensorBoard folder the sweep shares.
Importable by spawned worker processes (the several-processes test)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import optuna
import torch
from torch import nn

import hookscope as hs
from hookscope.data.digits import digits_loaders
from hookscope.integrations.optuna import DoctorPruning

GOOD, DOOMED = 0.1, 10.0
BUILD = threading.Lock()
LRS = [GOOD, DOOMED, GOOD, DOOMED]


class LrByNumber(optuna.samplers.BaseSampler):
    """Trial n gets ``LRS[n % 4]``: a sweep fixed in advance without Optuna's trial queue, which two
    processes on one SQLite storage can pop twice (Optuna's ``SELECT ... FOR UPDATE``; SQLite ignores it)."""

    def infer_relative_search_space(self, study, trial):
        return {}

    def sample_relative(self, study, trial, search_space):
        return {}

    def sample_independent(self, study, trial, param_name, param_distribution):
        return LRS[trial.number % len(LRS)]


def objective(trial: optuna.Trial, folder: Path, epochs: int = 2) -> float:
    """Train the trial's fit, pruned by the doctor or the study's pruner; returns the last valid_loss."""
    lr = trial.suggest_float("lr", 1e-3, 100.0, log=True)
    name = f"trial-{trial.number}"
    with BUILD:  # trials in threads share torch's global RNG: seed and build each model at once
        torch.manual_seed(trial.number)
        model = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    cbs = [
        hs.callbacks.Doctor(quiet=True),
        hs.callbacks.RunFolder(folder / "runs" / name, figures=False),
        hs.callbacks.MLflowCallback(tracking_uri=f"sqlite:///{folder / 'mlflow.db'}", run_name=name),
        hs.callbacks.TensorBoardCallback(log_dir=folder / "tb", run_name=name),
    ]
    learn = hs.Learner(
        model,
        digits_loaders(),
        nn.CrossEntropyLoss(),
        lr=lr,
        opt_func=torch.optim.SGD,
        metrics=[hs.metrics.accuracy],
        cbs=cbs,
        progress=False,
    )
    learn.fit(epochs, cbs=[DoctorPruning(trial, monitor="valid_loss")])
    return learn.recorder.history[-1]["valid_loss"]


def worker(storage: str, study_name: str, folder: str, n_trials: int, queued: bool) -> None:
    """One process of the sweep: ``n_trials`` trials of the study in ``storage``, in ``folder`` (MLflow
    puts the artifacts of a store given by URL in ``mlruns/`` of the working directory); the learning
    rates come from the study's queue when ``queued``, else from :class:`LrByNumber`."""
    os.chdir(folder)
    sampler = None if queued else LrByNumber()
    study = optuna.load_study(study_name=study_name, storage=_storage(storage), sampler=sampler)
    study.optimize(lambda trial: objective(trial, Path(folder)), n_trials=n_trials)


def _storage(url: str) -> str | optuna.storages.BaseStorage:
    """An RDB URL as it is; ``journal:<path>`` a journal file storage."""
    if not url.startswith("journal:"):
        return url
    backend = optuna.storages.journal.JournalFileBackend(url.removeprefix("journal:"))
    return optuna.storages.JournalStorage(backend)
