import io

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
    assert not hasattr(_learner(), "progress_bar")


def test_bar_prints_one_line_per_epoch_and_closes():
    bar, out = _bar()
    learn = _learner(cbs=[bar])
    learn.fit(2)
    lines = [line for line in out.getvalue().splitlines() if line.startswith("epoch ")]
    assert [line.split()[:2] for line in lines] == [["epoch", "0"], ["epoch", "1"]]
    assert f"valid_loss {learn.recorder.history[1]['valid_loss']:.4f}" in lines[1]
    assert not bar.is_open


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
