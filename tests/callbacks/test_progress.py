import io
import signal

import pytest
import torch
from rich.console import Console
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hookscope as hs


def _learner(cbs=(), progress=None):
    x, y = torch.randn(32, 3), torch.randn(32, 1)
    dls = (DataLoader(TensorDataset(x, y), batch_size=8), DataLoader(TensorDataset(x, y), batch_size=16))
    return hs.Learner(nn.Linear(3, 1), dls, nn.MSELoss(), cbs=cbs, progress=progress)


def _bar(**kwargs):
    out = io.StringIO()
    return hs.callbacks.ProgressBar(console=Console(file=out, width=120, force_terminal=False), **kwargs), out


def test_bar_is_added_only_when_asked_or_when_stdout_is_a_terminal():
    assert not hasattr(_learner(progress=False), "progress_bar")
    assert isinstance(_learner(progress=True).progress_bar, hs.callbacks.ProgressBar)
    # under pytest stdout is captured, not a terminal: auto means off
    assert not hs.callbacks.ProgressBar.is_seen()
    assert not hasattr(_learner(), "progress_bar")


def test_bar_prints_one_line_per_epoch_and_closes():
    bar, out = _bar()
    learn = _learner(cbs=[bar])
    learn.fit(2)
    lines = [line for line in out.getvalue().splitlines() if line.startswith("epoch ")]
    assert [line.split()[:2] for line in lines] == [["epoch", "1"], ["epoch", "2"]]  # counted from 1
    assert f"valid_loss {learn.recorder.history[1]['valid_loss']:.4f}" in lines[1]
    assert [row["epoch"] for row in learn.recorder.history] == [0, 1]  # the data stays 0-based
    assert not bar.is_open


def test_bar_names_the_phases_with_epochs_counted_from_1():
    bar, _ = _bar()
    seen = []

    class Spy(hs.Callback):
        order = 100  # after the bar has added the phase's task

        def before_train(self):
            seen.append(bar._progress.tasks[-1].description)

        def before_validate(self):
            seen.append(bar._progress.tasks[-1].description)

    _learner(cbs=[bar, Spy()]).fit(2)
    assert seen == ["epoch 1 train", "epoch 1 valid", "epoch 2 train", "epoch 2 valid"]


def test_ctrl_c_message_of_the_checkpoint_counts_epochs_from_1(tmp_path, capsys):
    class CtrlCInSecondEpoch(hs.Callback):
        def after_pred(self):
            if self.learn.training and self.learn.epoch == 1 and self.learn.iter == 1:
                signal.raise_signal(signal.SIGINT)

    learn = _learner(cbs=[hs.callbacks.Checkpoint(tmp_path)])
    with pytest.raises(KeyboardInterrupt):
        learn.fit(3, cbs=[CtrlCInSecondEpoch()])
    assert "hookscope: interrupted at epoch 2, step 6;" in capsys.readouterr().err


def test_bar_reads_the_smoothed_loss_at_a_bounded_rate():
    reads = []

    class CountingRecorder(hs.callbacks.Recorder):
        @property
        def smooth_loss(self):
            reads.append(1)
            return super().smooth_loss

    bar, _ = _bar(refresh_every=3600)
    _learner(cbs=[CountingRecorder(), bar]).fit(3)
    assert reads == []
    bar, _ = _bar(refresh_every=0)
    _learner(cbs=[CountingRecorder(), bar]).fit(1)
    assert len(reads) == 4  # every training batch when the interval is zero


def test_bar_is_closed_when_training_fails():
    class Boom(hs.Callback):
        def after_batch(self):
            raise RuntimeError("boom")

    bar, _ = _bar()
    learn = _learner(cbs=[bar, Boom()])
    with pytest.raises(RuntimeError, match="boom"):
        learn.fit(1)
    assert not bar.is_open


def test_validate_outside_fit_shows_nothing_and_works():
    bar, out = _bar()
    learn = _learner(cbs=[bar])
    assert set(learn.validate()) == {"valid_loss"}
    assert out.getvalue() == "" and not bar.is_open
