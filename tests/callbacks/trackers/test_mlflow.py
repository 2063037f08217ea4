"""MLflowCallback on a real SQLite store, read back through MlflowClient: metric histories, params, tags,
artifacts."""

import json
from pathlib import Path

import pytest
import torch
from trackers_support import faulty_learner, mlflow_client

import hookscope as hs
from hookscope.callbacks import MLflowCallback
from hookscope.callbacks.trackers import TrackerWarning

pytestmark = pytest.mark.usefixtures("deterministic")


def test_metrics_findings_and_artifacts_in_the_working_directorys_store(tmp_path):
    learn = faulty_learner(MLflowCallback(every=1, stats_every=5, log_dataset=True))
    learn.fit(2)
    client = mlflow_client(tmp_path / "mlflow.db")  # the default store, in the working directory
    run = client.get_run(learn.mlflow.run_id)
    assert run.info.status == "FINISHED"

    losses = client.get_metric_history(run.info.run_id, "train/loss")
    assert [m.step for m in losses] == list(range(len(learn.recorder.losses)))
    assert [m.value for m in losses] == pytest.approx(learn.recorder.losses, rel=1e-7)
    valid = client.get_metric_history(run.info.run_id, "epoch/valid_loss")
    assert [m.value for m in valid] == pytest.approx([row["valid_loss"] for row in learn.recorder.history])
    dead = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "dead_units/2")}
    assert sorted(dead) == list(range(0, 46, 5)) and dead[5] < 0.1 and dead[10] == 1.0  # died at step 6

    (finding,) = [f for f in learn.doctor.findings if f.kind == "dead_units"]
    assert run.data.tags["doctor.dead_units.2"] == f"step 6: [warning] {finding.message}"
    assert finding.message in run.data.tags["mlflow.note.content"]
    assert run.data.params["lr"] == str(learn.lr) and run.data.params["dataset.train_samples"] == "1438"

    folder = tmp_path / "download"

    def artifact(path):
        return Path(client.download_artifacts(run.info.run_id, path, folder))

    found = json.loads(artifact("doctor/findings.json").read_text())
    assert found == [json.loads(json.dumps(f.to_dict())) for f in learn.doctor.findings]
    assert artifact("model/summary.txt").read_text().count("Linear") == 2

    from safetensors.torch import load_file

    weights = load_file(artifact("model/model.safetensors"))
    assert all(torch.equal(weights[k], v) for k, v in learn.model.state_dict().items())

    step = learn.training_step - 1
    table = json.loads(artifact(f"predictions/step-{step}.json").read_text())
    assert table["columns"] == ["sample", "target", "prediction", "probability", "image"]
    rows = table["data"]
    assert [row[1] for row in rows] == learn.dls.valid.dataset.tensors[1][:16].tolist()
    image = rows[0][4]
    assert image["type"] == "image" and artifact(image["filepath"]).read_bytes()[:4] == b"\x89PNG"


@pytest.mark.filterwarnings("ignore:.*is resumed with fit")
def test_the_store_follows_the_run_folder_and_a_resume_continues_the_run(tmp_path):
    def make():
        folder = hs.callbacks.RunFolder(tmp_path / "run", checkpoints=True, figures=False)
        return faulty_learner(MLflowCallback(log_preds=False), folder)

    first = make()
    first.fit(1)
    store = tmp_path / "run" / "mlflow.db"
    client = mlflow_client(store)
    run_id = first.mlflow.run_id
    # the run folder was renamed from .run.partial when the fit ended: the artifacts moved with it
    assert client.get_run(run_id).info.artifact_uri.startswith(str(tmp_path / "run" / "mlartifacts"))
    assert {a.path for a in client.list_artifacts(run_id, "model")} == {
        "model/model.safetensors",
        "model/summary.txt",
    }

    second = make()
    second.fit(2, resume=tmp_path / "run")
    assert second.mlflow.run_id == run_id
    client = mlflow_client(store)
    assert [
        r.info.run_id for r in client.search_runs([client.get_experiment_by_name("hookscope").experiment_id])
    ] == [run_id]
    epochs = client.get_metric_history(run_id, "epoch")
    assert [(m.step, m.value) for m in epochs] == [(22, 1.0), (45, 2.0)]
    assert client.get_run(run_id).info.status == "FINISHED"
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["trackers"]["MLflow"] == {
        "path": "mlflow.db",
        "open": "mlflow ui --backend-store-uri sqlite:///mlflow.db",
    }


def test_a_tracking_uri_mlflow_cannot_use_warns_once_and_training_finishes(tmp_path):
    tracker = MLflowCallback(tracking_uri="nosuchscheme://nowhere")
    learn = faulty_learner(tracker, hs.callbacks.RunFolder(tmp_path / "run", figures=False))
    with pytest.warns(TrackerWarning) as caught:
        learn.fit(2)
    (warning,) = [w for w in caught if w.category is TrackerWarning]
    assert str(warning.message).startswith("MLflowCallback: starting failed") and "nosuchscheme" in str(
        warning.message
    )
    assert len(learn.recorder.history) == 2 and (tmp_path / "run" / "report.html").is_file()
    assert "trackers" not in json.loads((tmp_path / "run" / "config.json").read_text())
