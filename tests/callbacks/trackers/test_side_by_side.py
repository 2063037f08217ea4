"""Fits side by side logging to one MLflow SQLite store, one TensorBoard folder and one W&B folder: every
run's metrics and findings are complete when read back with each library's own reader — three real
processes, started together on a fresh store (the tables race MLflow used to lose)."""

import multiprocessing

import pytest
from trackers_support import mlflow_client, sweep_member, tensorboard, tensorboard_texts, wandb_series

N = 3


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """Three fits started at one barrier in three processes, all logging to one folder's trackers."""
    folder = tmp_path_factory.mktemp("sweep")
    spawn = multiprocessing.get_context("spawn")
    barrier, results = spawn.Barrier(N), spawn.Queue()
    members = [spawn.Process(target=sweep_member, args=(i, str(folder), barrier, results)) for i in range(N)]
    for member in members:
        member.start()
    ran, warned = {}, {}
    for _ in range(N):
        index, record, warnings = results.get(timeout=600)
        ran[index], warned[index] = record, warnings
    for member in members:
        member.join(timeout=120)
        assert member.exitcode == 0
    return folder, ran, warned


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_no_tracker_warned(sweep):
    _, _, warned = sweep
    assert warned == {i: [] for i in range(N)}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_mlflow_holds_every_run_complete(sweep):
    folder, ran, _ = sweep
    client = mlflow_client(folder / "mlflow.db")
    experiment = client.get_experiment_by_name("hookscope")
    runs = {run.info.run_id: run for run in client.search_runs([experiment.experiment_id])}
    assert sorted(run.info.run_name for run in runs.values()) == [f"member-{i}" for i in range(N)]
    for i, record in ran.items():
        run = runs[record["mlflow"]]
        assert run.info.status == "FINISHED" and run.info.run_name == f"member-{i}"
        losses = client.get_metric_history(run.info.run_id, "train/loss")
        assert [m.value for m in losses] == pytest.approx(record["losses"], rel=1e-7)
        valid = client.get_metric_history(run.info.run_id, "epoch/valid_loss")
        assert [m.value for m in valid] == pytest.approx(record["valid_loss"])
        assert client.get_metric_history(run.info.run_id, "dead_units/2")  # the statistics
        assert "doctor.dead_units.2" in run.data.tags and "dead_units" in record["findings"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_tensorboard_has_one_complete_run_per_fit(sweep):
    folder, ran, _ = sweep
    assert sorted(p.name for p in (folder / "tb").iterdir()) == [f"member-{i}" for i in range(N)]
    for i, record in ran.items():
        events = tensorboard(folder / "tb" / f"member-{i}")
        assert [e.value for e in events.Scalars("train/loss")] == pytest.approx(record["losses"], rel=1e-6)
        assert [e.step for e in events.Scalars("train/loss")] == list(range(len(record["losses"])))
        assert [step for step, _ in tensorboard_texts(events, "doctor/dead_units")] == [6]
        assert events.Histograms("activations/2")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_wandb_has_one_complete_offline_run_per_fit(sweep):
    folder, ran, _ = sweep
    runs = sorted((folder / "wandb").glob("offline-run-*"))
    assert sorted(run.name.rsplit("-", 1)[1] for run in runs) == sorted(r["wandb"] for r in ran.values())
    for record in ran.values():
        (run_dir,) = [run for run in runs if run.name.endswith(record["wandb"])]
        logged = wandb_series(run_dir, "train/loss")
        assert [value for _, value in logged] == pytest.approx(record["losses"], rel=1e-7)
        (step, _), *_ = wandb_series(run_dir, "doctor/findings")
        assert step == 6
