"""MetricsLogger: the rows of metrics.csv / metrics.jsonl, their rate, and resuming them."""

import csv
import json

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hookscope as hs
from hookscope.callbacks.loggers import MetricsLogger
from hookscope.metrics import accuracy
from hookscope.run_reader import read_metrics


def _learner(cbs, n=64, batch_size=8):
    torch.manual_seed(0)
    x, y = torch.randn(n, 4), torch.randint(0, 3, (n,))
    train = DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True)
    valid = DataLoader(TensorDataset(x[:16], y[:16]), batch_size=batch_size)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    return hs.Learner(
        model, (train, valid), nn.CrossEntropyLoss(), metrics=[accuracy], cbs=cbs, progress=False
    )


def test_epoch_rows_copy_the_recorder_history(tmp_path):
    learn = _learner([MetricsLogger(tmp_path, every=3)])
    learn.fit(2)
    epochs = [r for r in read_metrics(tmp_path) if r["kind"] == "epoch"]
    assert [r["epoch"] for r in epochs] == [0, 1]
    for row, hist in zip(epochs, learn.recorder.history, strict=True):
        assert row["valid_loss"] == pytest.approx(hist["valid_loss"])
        assert row["accuracy"] == pytest.approx(hist["accuracy"])
    assert epochs[-1]["step"] == learn.training_step == 16


def test_step_rows_every_n_steps_hold_that_steps_loss_and_lr(tmp_path):
    learn = _learner([MetricsLogger(tmp_path, every=3)])
    learn.fit(2)
    steps = [r for r in read_metrics(tmp_path) if r["kind"] == "step"]
    assert [r["step"] for r in steps] == [3, 6, 9, 12, 15]
    losses, lrs = learn.recorder.losses, learn.recorder.lrs
    for row in steps:
        assert row["train_loss"] == pytest.approx(losses[row["step"] - 1])
        assert row["lr"] == pytest.approx(lrs[row["step"] - 1])
    assert [r["epoch"] for r in steps] == [0, 0, 1, 1, 1]


def test_csv_holds_the_same_rows_as_jsonl(tmp_path):
    _learner([MetricsLogger(tmp_path, every=4)]).fit(1)
    with open(tmp_path / "metrics.csv", newline="") as f:
        table = list(csv.DictReader(f))
    rows = read_metrics(tmp_path)
    assert list(table[0])[:3] == ["kind", "epoch", "step"]
    assert [r["kind"] for r in table] == [r["kind"] for r in rows] == ["step", "step", "epoch"]
    assert float(table[-1]["valid_loss"]) == pytest.approx(rows[-1]["valid_loss"])
    assert table[0]["valid_loss"] == ""


def test_every_zero_logs_epochs_only_and_no_temp_file_is_left(tmp_path):
    _learner([MetricsLogger(tmp_path, every=0)]).fit(2)
    assert {r["kind"] for r in read_metrics(tmp_path)} == {"epoch"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.csv", "metrics.jsonl"]


def test_state_dict_lets_a_resumed_run_continue_the_files(tmp_path):
    first = MetricsLogger(tmp_path, every=8)
    _learner([first]).fit(1)
    second = MetricsLogger(tmp_path, every=8)
    second.load_state_dict(json.loads(json.dumps(first.state_dict())))
    _learner([second]).fit(1)
    assert [r["kind"] for r in read_metrics(tmp_path)] == ["step", "epoch", "step", "epoch"]


def test_non_finite_losses_are_written_as_json_null(tmp_path):
    logger = MetricsLogger(tmp_path)
    logger.rows = [{"kind": "epoch", "epoch": 0, "step": 1, "train_loss": float("nan")}]
    logger.write()
    assert json.loads((tmp_path / "metrics.jsonl").read_text())["train_loss"] is None


def test_step_rows_reach_the_files_during_a_long_epoch(tmp_path):
    seen = []

    class Spy(hs.Callback):
        order = 50

        def after_step(self):
            seen.append(sum(r["kind"] == "step" for r in read_metrics(tmp_path)))

    _learner([MetricsLogger(tmp_path, every=1, flush_rows=3), Spy()]).fit(1)
    assert seen == [0, 0, 3, 3, 3, 6, 6, 6]


def test_a_mid_epoch_state_dict_holds_the_pending_step_rows(tmp_path):
    logger = MetricsLogger(tmp_path, every=1)
    states = []

    class Saver(hs.Callback):
        order = 90

        def after_step(self):
            if self.learn.training_step == 3:
                states.append(logger.state_dict())

    _learner([logger, Saver()]).fit(1)
    assert [r["step"] for r in states[0]["rows"]] == [1, 2, 3]


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="every=-1"):
        MetricsLogger("x", every=-1)
    with pytest.raises(ValueError, match="flush_rows=0"):
        MetricsLogger("x", flush_rows=0)


class _FailAtStep(hs.Callback):
    def __init__(self, step):
        self.step = step

    def after_step(self):
        if self.learn.training_step == self.step:
            raise RuntimeError("boom")


def test_a_crashed_fit_keeps_the_step_rows_logged_before_the_crash(tmp_path):
    learn = _learner([MetricsLogger(tmp_path, every=2, flush_rows=50), _FailAtStep(7)])
    with pytest.raises(RuntimeError, match="boom"):
        learn.fit(1)
    assert [r["step"] for r in read_metrics(tmp_path)] == [2, 4, 6]


def test_an_lr_find_sweep_is_not_logged_as_the_runs_metrics(tmp_path):
    learn = _learner([MetricsLogger(tmp_path, every=1)])
    learn.lr_find(num_it=5)
    learn.fit(1)
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows if r["kind"] == "step"] == list(range(1, 9))
    assert [r["epoch"] for r in rows if r["kind"] == "epoch"] == [0]
