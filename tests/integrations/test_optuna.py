"""DoctorPruning: the study's pruner judges the monitored value, and the doctor's error findings prune at
once with the finding in the trial's user attributes — for trials in threads of one process and in
processes sharing an SQLite or journal storage; every trial's run folder and tracker runs are kept."""

import multiprocessing

import optuna
import pytest
import torch
from optuna_support import DOOMED, GOOD, LRS, _storage, objective, worker
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hookscope as hs
from hookscope.data.digits import digits_loaders
from hookscope.integrations.optuna import DoctorPruning, watch_pruning
from hookscope.staged_folder import read_json


def queued_study(storage=None, name=None, queued=True):
    study = optuna.create_study(storage=storage, study_name=name, pruner=optuna.pruners.NopPruner())
    for lr in LRS if queued else []:
        study.enqueue_trial({"lr": lr})
    return study


def check_sweep(study, folder):
    """Half pruned by the doctor with their finding, half complete; every run folder and tracker run."""
    trials = sorted(study.trials, key=lambda t: t.number)
    assert len(trials) == 4
    for trial in trials:
        name = f"trial-{trial.number}"
        if trial.params["lr"] == DOOMED:
            assert trial.state == optuna.trial.TrialState.PRUNED
            finding = trial.user_attrs["doctor_finding"]
            assert finding["kind"] == "loss_divergence" and finding["step"] < 23  # within the first epoch
            assert "diverges" in finding["message"] and set(finding) == {"kind", "module", "step", "message"}
            config = read_json(folder / "runs" / f".{name}.partial" / "config.json")
            assert (
                config["status"] == "failed"
                and "TrialPruned: the doctor found loss_divergence" in config["error"]
            )
        else:
            assert (
                trial.state == optuna.trial.TrialState.COMPLETE and "doctor_finding" not in trial.user_attrs
            )
            config = read_json(folder / "runs" / name / "config.json")
            assert config["status"] == "complete"
        assert (folder / "tb" / name).is_dir()
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("hookscope").experiment_id])
    statuses = {run.info.run_name: run.info.status for run in runs}
    assert statuses == {
        f"trial-{t.number}": "FAILED" if t.params["lr"] == DOOMED else "FINISHED" for t in trials
    }


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_four_trials_in_threads_of_one_process(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MLflow's mlruns/ for the artifacts
    study = queued_study()
    study.optimize(lambda trial: objective(trial, tmp_path), n_trials=4, n_jobs=2)
    check_sweep(study, tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_four_trials_in_two_processes_sharing_a_storage(tmp_path, kind):
    storage = (
        f"sqlite:///{tmp_path / 'optuna.db'}" if kind == "sqlite" else f"journal:{tmp_path / 'optuna.log'}"
    )
    queued = kind == "journal"  # SQLite lets two processes pop one queued trial: see docs/integrations.md
    queued_study(_storage(storage), "sweep", queued)
    spawn = multiprocessing.get_context("spawn")
    args = (storage, "sweep", str(tmp_path), 2, queued)
    workers = [spawn.Process(target=worker, args=args) for _ in range(2)]
    for process in workers:
        process.start()
    for process in workers:
        process.join(timeout=600)
        assert process.exitcode == 0
    check_sweep(optuna.load_study(study_name="sweep", storage=_storage(storage)), tmp_path)


def test_the_studys_pruner_judges_the_monitored_value(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    study = optuna.create_study(pruner=optuna.pruners.ThresholdPruner(upper=0.01))  # every loss is above
    study.enqueue_trial({"lr": GOOD})
    study.optimize(lambda trial: objective(trial, tmp_path, epochs=3), n_trials=1)
    (trial,) = study.trials
    assert trial.state == optuna.trial.TrialState.PRUNED and "doctor_finding" not in trial.user_attrs
    assert list(trial.intermediate_values) == [0]  # pruned after its first epoch's report


def test_an_unknown_monitor_is_refused_naming_the_choices(tmp_path):
    study = optuna.create_study()
    trial = study.ask()
    x = torch.randn(8, 2)
    data = DataLoader(TensorDataset(x, x), batch_size=4)
    learn = hs.Learner(nn.Linear(2, 2), (data, data), nn.MSELoss(), progress=False)
    with pytest.raises(KeyError, match=r"monitor='accuracy' is not in learn\.recorder\.history"):
        learn.fit(1, cbs=[DoctorPruning(trial, monitor="accuracy")])


def test_watch_pruning_stops_a_hand_written_loop_at_the_finding():
    study = optuna.create_study()
    trial = study.ask()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    opt = torch.optim.SGD(model.parameters(), lr=DOOMED)
    train, _ = digits_loaders()
    steps = 0
    pruned = pytest.raises(optuna.TrialPruned, match="the doctor found loss_divergence")
    with pruned, hs.watch(model, opt, quiet=True) as w:
        watch_pruning(trial, w)
        for x, y in [*train, *train]:  # two epochs of 23 steps: the doctor checks after 5, 25, 45
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            w.log(loss)
            opt.step()
            steps += 1
    assert steps < 2 * len(train) and trial.user_attrs["doctor_finding"]["kind"] == "loss_divergence"
