"""``hookscope train --log tensorboard,wandb,mlflow``: the trackers write inside the run folder and the
report says where."""

import json

import pytest
from trackers_support import mlflow_client, tensorboard

from hookscope.cli import main


@pytest.mark.slow
def test_train_logs_to_the_three_trackers_and_the_report_names_them(tmp_path):
    out = tmp_path / "run"
    assert main(["train", "--epochs", "1", "--out", str(out), "--log", "tensorboard,wandb,mlflow"]) == 0
    trackers = json.loads((out / "config.json").read_text())["trackers"]
    assert list(trackers) == ["TensorBoard", "W&B", "MLflow"]
    assert trackers["TensorBoard"] == {"path": "tensorboard", "open": "tensorboard --logdir tensorboard"}
    (wandb_dir,) = (out / "wandb").glob("offline-run-*")
    assert trackers["W&B"] == {
        "path": f"wandb/{wandb_dir.name}",
        "open": f"wandb sync wandb/{wandb_dir.name}",
    }

    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    (epoch,) = [row for row in metrics if row["kind"] == "epoch"]
    (logged,) = tensorboard(out / "tensorboard").Scalars("epoch/valid_loss")
    assert logged.value == pytest.approx(epoch["valid_loss"], rel=1e-7)
    client = mlflow_client(out / "mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("hookscope").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["options.model"] == "hookscope.models:digits_cnn"

    report = (out / "report.html").read_text()
    assert '<table id="trackers">' in report
    assert "mlflow ui --backend-store-uri sqlite:///mlflow.db" in report


def test_an_unknown_tracker_is_refused_naming_the_choices(capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["train", "--log", "tensorboard,neptune"])
    assert stopped.value.code == 2
    assert "unknown tracker neptune; choose from tensorboard, wandb, mlflow" in capsys.readouterr().err
