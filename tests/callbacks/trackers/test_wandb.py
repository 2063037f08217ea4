"""WandbCallback offline, read back from the offline run's own files (W&B's record protobufs, the media
and artifact files it wrote): nothing reaches the network."""

import json
from pathlib import Path

import pytest
from trackers_support import faulty_learner, wandb_history, wandb_records, wandb_run, wandb_series

import hookscope as hs
from hookscope.callbacks import WandbCallback

pytestmark = pytest.mark.usefixtures("deterministic")


def _offline_runs(root):
    return sorted((root / "wandb").glob("offline-run-*"))


def _table(run_dir, key):
    """``(global_step, table)`` of the last table logged under ``key``."""
    step, ref = wandb_series(run_dir, key)[-1]
    return step, json.loads((run_dir / "files" / ref["path"]).read_text())


def test_the_articles_line_runs_offline_and_logs_the_run(tmp_path):
    wb = WandbCallback(log_preds=True, log_model=True, log_dataset=True)  # article 004, unchanged
    learn = faulty_learner()
    learn.fit(2, cbs=[wb])
    (run_dir,) = _offline_runs(tmp_path)
    records = wandb_records(run_dir)

    losses = learn.recorder.losses
    logged = wandb_series(run_dir, "train/loss")
    assert [step for step, _ in logged] == list(range(0, len(losses), 10))
    assert [value for _, value in logged] == pytest.approx(losses[::10], rel=1e-7)
    valid = [row["valid_loss"] for row in learn.recorder.history]
    assert [v for _, v in wandb_series(run_dir, "epoch/valid_loss")] == pytest.approx(valid)

    (finding,) = [f for f in learn.doctor.findings if f.kind == "dead_units"]
    step, findings = _table(run_dir, "doctor/findings")
    assert step == finding.step == 6
    assert [6, "2", "dead_units", "warning", finding.message] in findings["data"]
    run = wandb_run(records)
    assert finding.message in run.notes and "doctor:dead_units" in run.tags

    step, predictions = _table(run_dir, "predictions")
    assert step == learn.training_step - 1
    assert predictions["columns"] == ["image", "sample", "target", "prediction", "probability"]
    targets = learn.dls.valid.dataset.tensors[1][:16].tolist()
    assert [row[2] for row in predictions["data"]] == targets
    artifacts = {r.artifact.name: r.artifact for r in records if r.WhichOneof("record_type") == "artifact"}
    entries = artifacts[f"run-{run.run_id}-predictions"].manifest.contents  # the table and its images
    images = [e for e in entries if e.path.startswith("media/images/")]
    assert len(images) == 16 and all(Path(e.local_path).read_bytes()[:4] == b"\x89PNG" for e in images)

    artifacts = {a.type: a for a in artifacts.values()}
    assert [entry.path for entry in artifacts["model"].manifest.contents] == ["model.safetensors"]
    assert json.loads(artifacts["dataset"].metadata)["train_samples"] == 1438
    config = {
        item.key: json.loads(item.value_json)
        for r in records
        if r.WhichOneof("record_type") == "config"
        for item in r.config.update
    }
    assert config["lr"] == learn.lr and config["dataset"]["classes"] == 10
    assert (run_dir / "files" / "model_summary.txt").read_text().count("Linear") == 2


def test_histograms_are_the_device_counts(tmp_path):
    learn = faulty_learner(WandbCallback(hist_every=20, log_preds=False, log_model=False))
    learn.fit(1)
    (run_dir,) = _offline_runs(tmp_path)
    logged = wandb_series(run_dir, "activations/1")
    assert [step for step, _ in logged] == [0, 20]
    history = {r.step: r.stats for r in learn.doctor.activations.history["1"]}
    for step, histogram in logged:
        assert histogram["_type"] == "histogram"
        assert histogram["values"] == history[step].histogram.tolist()
        assert histogram["bins"] == pytest.approx(history[step].edges.tolist())
    assert all(row["global_step"] % 1 == 0 for row in wandb_history(run_dir))


def test_a_resumed_fit_continues_the_same_run(tmp_path):
    class Crash(hs.Callback):
        order = 95

        def after_step(self):
            if self.learn.training_step == 30:
                raise RuntimeError("power cut")

    def make(*cbs):
        ckpt = hs.callbacks.Checkpoint(tmp_path / "ckpt")
        return faulty_learner(ckpt, WandbCallback(log_preds=False, log_model=False), *cbs)

    first = make(Crash())
    with pytest.raises(RuntimeError, match="power cut"):
        first.fit(2)
    learn = make()
    learn.fit(2, resume=tmp_path / "ckpt")
    runs = _offline_runs(tmp_path)
    assert len(runs) == 2
    # W&B names each offline folder and its run file after the run id
    assert {next(r.glob("run-*.wandb")).stem for r in runs} == {f"run-{first.wandb.run_id}"}
    assert learn.wandb.run_id == first.wandb.run_id


def test_a_run_the_user_started_is_used_and_left_open(tmp_path):
    import wandb

    run = wandb.init(project="mine", dir=str(tmp_path), mode="offline")
    try:
        learn = faulty_learner(WandbCallback(log_preds=False, log_model=False))
        learn.fit(1)
        assert learn.wandb.run_id == run.id and wandb.run is run
        run.log({"after": 1.0})  # still open
    finally:
        run.finish()
