"""Every Python example of docs/trackers.md runs as written (offline, in a scratch folder) and writes
where the page says."""

import re
from pathlib import Path

import pytest
from trackers_support import mlflow_client, tensorboard, wandb_series

DOC = Path(__file__).parents[3] / "docs" / "trackers.md"
EXAMPLES = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)


def run(example: str) -> None:
    exec(compile(example, str(DOC), "exec"), {"__name__": "__docs__"})


def test_the_page_has_one_example_per_tracker():
    assert len(EXAMPLES) == 3
    assert all(name in text for name, text in zip(["TensorBoard", "Wandb", "MLflow"], EXAMPLES, strict=True))


@pytest.mark.slow
def test_tensorboard_example(tmp_path):
    run(EXAMPLES[0])
    events = tensorboard(tmp_path / "runs" / "tb-digits")
    assert [e.step for e in events.Scalars("train/loss")] == [0, 10, 20, 30, 40]  # 46 steps, every 10th
    assert events.Histograms("activations/features.0.0") and events.Scalars("dead_units/features.0.2")


@pytest.mark.slow
def test_wandb_example_is_the_articles_line(tmp_path):
    assert "WandbCallback(log_preds=True, log_model=True, log_dataset=True)" in EXAMPLES[1]
    run(EXAMPLES[1])
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    assert [step for step, _ in wandb_series(run_dir, "train/loss")] == [0, 10, 20, 30, 40]


@pytest.mark.slow
def test_mlflow_example(tmp_path):
    run(EXAMPLES[2])
    client = mlflow_client(tmp_path / "runs" / "digits-mlflow" / "mlflow.db")
    (found,) = client.search_runs([client.get_experiment_by_name("digits").experiment_id])
    assert found.info.status == "FINISHED"
    assert len(client.get_metric_history(found.info.run_id, "epoch/valid_loss")) == 2
