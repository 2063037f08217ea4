"""RunFolder: the run folder and report.html from a plain Learner.fit, with one callback."""

import json

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hookscope as hs
from hookscope.callbacks import Doctor, RunFolder
from hookscope.staged_folder import RunFolderError


class Boom(hs.Callback):
    """Raises at a chosen training step (a crash in the middle of a run)."""

    def __init__(self, at_step):
        self.at_step = at_step

    def after_step(self):
        if self.learn.training_step == self.at_step:
            raise ValueError(f"boom at step {self.at_step}")


def conv_learner(cbs, seed=0):
    """A tiny CNN on random 8x8 images: 6 training batches, 2 validation batches."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 1, 8, 8, generator=g), torch.randint(0, 3, (64,), generator=g)
    train = DataLoader(TensorDataset(x[:48], y[:48]), batch_size=8, shuffle=True, generator=g)
    valid = DataLoader(TensorDataset(x[48:], y[48:]), batch_size=8)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 64, 3))
    return hs.Learner(
        model, (train, valid), nn.CrossEntropyLoss(), lr=1e-2, metrics=[hs.metrics.accuracy], cbs=cbs,
        progress=False,
    )  # fmt: skip


def test_one_callback_gives_a_fit_the_whole_run_folder_and_report(tmp_path):
    out = tmp_path / "runs" / "a"
    learn = conv_learner([Doctor(quiet=True), RunFolder(out, config={"data": "random 8x8"})])
    learn.fit(2)

    assert not (tmp_path / "runs" / ".a.partial").exists()
    names = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert {"config.json", "metrics.csv", "metrics.jsonl", "summary.txt", "summary.json", "findings.json",
            "stats.json", "report.html"} <= names  # fmt: skip
    figures = {n for n in names if n.startswith("figures/")}
    assert {"figures/loss.png", "figures/lr.png", "figures/feature_maps_0.png",
            "figures/gradient_flow.png", "figures/activations.png"} <= figures  # fmt: skip

    config = json.loads((out / "config.json").read_text())
    assert config["status"] == "complete" and config["name"] == "a"
    assert config["options"] == {"data": "random 8x8"}
    learner = config["learner"]
    assert learner["model"] == "Sequential" and learner["loss_func"] == "CrossEntropyLoss"
    assert learner["epochs"] == 2 and learner["batch_size"] == 8 and learner["lr"] == 1e-2
    # the Doctor's guard and the RunFolder's MetricsLogger are companions: callbacks of the Learner too
    assert learner["callbacks"] == ["Recorder", "Doctor", "NonFiniteGuard", "RunFolder", "MetricsLogger"]
    assert config["duration_s"] > 0 and "torch" in config["versions"]
    epochs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    epochs = [row for row in epochs if row["kind"] == "epoch"]
    assert [row["epoch"] for row in epochs] == [0, 1]
    assert epochs[-1]["valid_loss"] == pytest.approx(learn.recorder.history[-1]["valid_loss"])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["total_params"] == sum(p.numel() for p in learn.model.parameters())
    assert summary["total_macs"] == 4 * 9 * 64 + 4 * 64 * 3  # one sample: the conv and the linear

    report = (out / "report.html").read_text()
    assert "hookscope run <code>a</code>" in report and "data:image/png;base64," in report
    assert "Sequential" in report and "random 8x8" in report


def test_without_statistics_the_report_says_so_and_no_findings_file_is_written(tmp_path):
    learn = conv_learner([RunFolder(tmp_path / "b", figures=False)])
    learn.fit(1)
    out = tmp_path / "b"
    assert not (out / "findings.json").exists() and not (out / "figures").exists()
    assert "The doctor was off for this run" in (out / "report.html").read_text()


def test_a_crash_keeps_the_partial_folder_with_a_report_saying_where_it_stopped(tmp_path):
    out = tmp_path / "c"
    learn = conv_learner([RunFolder(out, checkpoints={"every_n_steps": 2, "sigint": False}), Boom(at_step=9)])
    with pytest.raises(ValueError, match="boom at step 9"):
        learn.fit(3)

    partial = tmp_path / ".c.partial"
    assert not out.exists() and partial.is_dir()
    config = json.loads((partial / "config.json").read_text())
    assert config["status"] == "failed" and config["error"] == "ValueError: boom at step 9"
    assert config["stopped_at"] == {"epoch": 1, "batch": 2, "training_step": 9, "phase": "train"}
    assert (partial / "checkpoints" / "last.pt").is_file()
    report = (partial / "report.html").read_text()
    assert "failed" in report and "boom at step 9" in report and "epoch 2" in report


def test_resume_continues_the_same_folder_and_keeps_its_history(tmp_path):
    out = tmp_path / "d"
    every_2 = {"every_n_steps": 2, "sigint": False}
    crashed = conv_learner([RunFolder(out, checkpoints=every_2), Boom(at_step=8)])
    with pytest.raises(ValueError):
        crashed.fit(3)
    started = json.loads((tmp_path / ".d.partial" / "config.json").read_text())["started"]

    learn = conv_learner([RunFolder(out, checkpoints=every_2)])
    learn.fit(3, resume=tmp_path / ".d.partial")

    assert out.is_dir() and not (tmp_path / ".d.partial").exists()
    config = json.loads((out / "config.json").read_text())
    assert config["status"] == "complete" and config["started"] == started
    assert len(config["commands"]) == 2  # the interrupted part's command and the resumed one's
    assert config["resumed_from"].endswith("last.pt")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows if r["kind"] == "epoch"] == [0, 1, 2]


def test_an_lr_sweep_writes_no_run_folder(tmp_path):
    learn = conv_learner([RunFolder(tmp_path / "e")])
    learn.lr_find(num_it=5)
    assert not any(tmp_path.iterdir())


def test_a_second_fit_continues_the_folder_of_the_first(tmp_path):
    out = tmp_path / "f"
    learn = conv_learner([RunFolder(out, figures=False)])
    learn.fit(1)
    learn.fit(1)
    config = json.loads((out / "config.json").read_text())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert config["status"] == "complete" and sum(r["kind"] == "epoch" for r in rows) == 2
    assert not (tmp_path / ".f.partial").exists()


def test_an_unrelated_folder_is_refused_before_anything_trains(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(RunFolderError, match="hookscope did not write it"):
        RunFolder(mine)
    assert (mine / "notes.txt").read_text() == "keep me"


def test_resuming_a_finished_run_copies_it_and_replaces_it_only_at_the_end(tmp_path):
    out = tmp_path / "g"
    first = conv_learner([RunFolder(out, figures=False, checkpoints=True)])
    first.fit(1)
    (tmp_path / ".g.partial").mkdir()  # a stale partial folder must not be mistaken for this run
    learn = conv_learner([RunFolder(out, figures=False, checkpoints=True)])
    with pytest.warns(UserWarning, match="saved during fit"):  # the run is extended, its schedule too
        learn.fit(2, resume=out)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows if r["kind"] == "epoch"] == [0, 1]
    assert (out / "checkpoints" / "last.pt").is_file() and not (tmp_path / ".g.partial").exists()
