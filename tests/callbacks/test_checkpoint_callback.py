import io
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from small_learner import tiny_learner, weights
from torch import nn
from torch.utils.data import DataLoader

import hookscope as hs
from hookscope.callbacks import Checkpoint
from hookscope.train.checkpoint import load_checkpoint
from hookscope.train.events import CancelFitException

SCRIPT = Path(__file__).with_name("checkpoint_run.py")
BATCHES = 5  # per epoch in tiny_learner


pytestmark = pytest.mark.usefixtures("deterministic")  # bitwise-equal resume needs it (conftest.py)


def position(path):
    return load_checkpoint(path)["position"]


class At(hs.Callback):
    """Calls ``action(learn)`` at ``event`` of training step ``step`` (counted from 1)."""

    order = 100

    def __init__(self, step, action, event="after_batch"):
        self.step, self.action, self.event = step, action, event

    def after_pred(self):
        self._maybe("after_pred", self.learn.training_step + 1)

    def after_batch(self):
        self._maybe("after_batch", self.learn.training_step)

    def _maybe(self, event, step):
        if self.learn.training and event == self.event and step == self.step:
            self.action(self.learn)


def cancel_fit(learn):
    raise CancelFitException()


def raise_sigint(learn):
    signal.raise_signal(signal.SIGINT)


# ---- files ------------------------------------------------------------------------------------------


def test_keeps_the_last_k_and_last_pt_is_the_newest(tmp_path):
    learn = tiny_learner([Checkpoint(tmp_path, every_n_steps=2, keep_last=2)])
    learn.fit(2)

    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-00000008.pt", "ckpt-00000010.pt", "last.pt"]
    assert os.path.samefile(tmp_path / "last.pt", tmp_path / "ckpt-00000010.pt")
    assert position(tmp_path / "last.pt")["epoch"] == 2
    assert position(tmp_path / "ckpt-00000008.pt") == {
        "epoch": 1,
        "iter": 3,
        "train_iter": 8,
        "training_step": 8,
        "n_epoch": 2,
    }


@pytest.mark.parametrize("mode", ["min", "max"])
def test_best_pt_is_the_best_epoch_by_the_monitored_value(tmp_path, mode):
    learn = tiny_learner([Checkpoint(tmp_path, every_epoch=False, monitor="valid_loss", mode=mode)])
    learn.fit(4)

    losses = [row["valid_loss"] for row in learn.recorder.history]
    best = min(losses) if mode == "min" else max(losses)
    assert learn.checkpoint.best == best
    assert position(tmp_path / "best.pt")["epoch"] == losses.index(best) + 1
    assert load_checkpoint(tmp_path / "best.pt")["callbacks"]["recorder"]["history"][-1]["valid_loss"] == best


def test_unknown_monitor_is_refused_before_training_naming_the_available_keys(tmp_path):
    learn = tiny_learner([Checkpoint(tmp_path, monitor="val_acc")])
    learn.metrics = [hs.metrics.accuracy]
    available = r"\(available: train_loss, valid_loss, accuracy\); pass one of those"
    with pytest.raises(KeyError, match=r"monitor='val_acc' is not in learn\.recorder\.history " + available):
        learn.fit(1)
    assert learn.training_step == 0


def test_bad_arguments_are_one_line_errors(tmp_path):
    with pytest.raises(ValueError, match="keep_last=0"):
        Checkpoint(tmp_path, keep_last=0)
    with pytest.raises(ValueError, match="mode='best'"):
        Checkpoint(tmp_path, mode="best")


def test_stale_temp_files_of_a_killed_save_are_removed(tmp_path):
    (tmp_path / ".ckpt-00000004.pt.abc123.tmp").write_bytes(b"half")
    tiny_learner([Checkpoint(tmp_path)]).fit(1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-00000005.pt", "last.pt"]


def test_an_lr_sweep_writes_no_checkpoint(tmp_path):
    learn = tiny_learner([Checkpoint(tmp_path, every_n_steps=1, keep_last=2)])
    learn.fit(1)
    files = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    learn.lr_find(num_it=8)
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == files
    assert position(tmp_path / "last.pt")["training_step"] == BATCHES


# ---- exact resume (in process) ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def one_cycle_reference():
    """Final weights of an uninterrupted fit_one_cycle(3) of tiny_learner."""
    learn = tiny_learner()
    learn.fit_one_cycle(3, lr_max=0.05)
    return weights(learn)


@pytest.mark.parametrize("in_memory", [True, False], ids=["in_memory", "plain_loader"])
@pytest.mark.parametrize("stop_at", [2, 5, 13])
def test_mid_epoch_resume_is_bitwise_equal(tmp_path, one_cycle_reference, in_memory, stop_at):
    first = tiny_learner([Checkpoint(tmp_path, every_n_steps=1)], in_memory=in_memory)
    first.fit_one_cycle(3, lr_max=0.05, cbs=[At(stop_at, cancel_fit)])
    assert position(tmp_path / "last.pt")["training_step"] == stop_at

    torch.manual_seed(1000 + stop_at)
    random.seed(stop_at)
    resumed = tiny_learner([Checkpoint(tmp_path, every_n_steps=1)], seed=7, in_memory=in_memory)
    resumed.fit_one_cycle(3, lr_max=0.05, resume="last")

    assert resumed.training_step == 3 * BATCHES
    assert all(torch.equal(a, b) for a, b in zip(one_cycle_reference, weights(resumed), strict=True))


def test_failed_write_during_fit_keeps_last_pt_loadable_and_resumable(
    tmp_path, monkeypatch, one_cycle_reference
):
    real_save, calls = torch.save, []

    def crash_on_third_save(obj, file):
        calls.append(1)
        if len(calls) < 3:
            return real_save(obj, file)
        buffer = io.BytesIO()
        real_save(obj, buffer)
        file.write(buffer.getvalue()[: buffer.tell() // 2])
        raise OSError("No space left on device")

    monkeypatch.setattr(torch, "save", crash_on_third_save)
    learn = tiny_learner([Checkpoint(tmp_path, every_n_steps=1, keep_last=3)])
    with pytest.raises(OSError, match="No space left"):
        learn.fit_one_cycle(3, lr_max=0.05)
    monkeypatch.undo()

    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-00000001.pt", "ckpt-00000002.pt", "last.pt"]
    assert position(tmp_path / "last.pt")["training_step"] == 2
    resumed = tiny_learner([Checkpoint(tmp_path, every_n_steps=1)], seed=3)
    resumed.fit_one_cycle(3, lr_max=0.05, resume=tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(one_cycle_reference, weights(resumed), strict=True))


class NoisyData(torch.utils.data.Dataset):
    """Random augmentation from torch's and python's global RNGs (in the workers when num_workers > 0)."""

    def __init__(self, n):
        data = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 6, generator=data), torch.randint(0, 3, (n,), generator=data)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i] + 0.1 * torch.randn(6) + random.random(), self.y[i]


def noisy_learner(workers, cbs=(), seed=0):
    train = DataLoader(NoisyData(40), batch_size=8, shuffle=True, num_workers=workers)
    valid = DataLoader(NoisyData(16), batch_size=8, num_workers=workers)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.25), nn.Linear(16, 3))
    return hs.Learner(model, (train, valid), nn.CrossEntropyLoss(), lr=1e-2, cbs=list(cbs), progress=False)


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_mid_epoch_resume_with_random_augmentation_in_the_loader_is_bitwise_equal(tmp_path, workers):
    torch.manual_seed(0)
    random.seed(0)
    reference = noisy_learner(workers)
    reference.fit(2)

    torch.manual_seed(0)
    random.seed(0)
    first = noisy_learner(workers, [Checkpoint(tmp_path, every_n_steps=1)])
    first.fit(2, cbs=[At(8, cancel_fit)])
    torch.manual_seed(77)
    random.seed(3)
    resumed = noisy_learner(workers, [Checkpoint(tmp_path, every_n_steps=1)], seed=4)
    resumed.fit(2, resume="last")
    assert all(torch.equal(a, b) for a, b in zip(weights(reference), weights(resumed), strict=True))


class SigintAtBatch(hs.Callback):
    """Ctrl-C during the forward of training batch number ``n`` of the fit (counted from 0)."""

    def __init__(self, n):
        self.n = n

    def after_pred(self):
        if self.learn.training and self.learn.train_iter == self.n:
            signal.raise_signal(signal.SIGINT)


def test_resume_in_the_middle_of_gradient_accumulation_is_bitwise_equal(tmp_path):
    reference = tiny_learner([hs.callbacks.GradientAccumulation(2)])
    reference.fit(2)

    first = tiny_learner([hs.callbacks.GradientAccumulation(2), Checkpoint(tmp_path)])
    with pytest.raises(KeyboardInterrupt):
        first.fit(2, cbs=[SigintAtBatch(2)])  # batch 2 is the first of a group: its gradient is pending
    assert set(load_checkpoint(tmp_path / "last.pt")["grads"]) == {"0.weight", "0.bias", "3.weight", "3.bias"}

    resumed = tiny_learner([hs.callbacks.GradientAccumulation(2), Checkpoint(tmp_path)], seed=4)
    resumed.fit(2, resume="last")
    assert all(torch.equal(a, b) for a, b in zip(weights(reference), weights(resumed), strict=True))


# ---- Ctrl-C and failures (in process) ---------------------------------------------------------------


def test_sigint_finishes_the_step_saves_and_raises_with_the_resume_hint(tmp_path, capsys):
    learn = tiny_learner([Checkpoint(tmp_path)])
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN where the suite runs in the background (`make test &`)
    with pytest.raises(KeyboardInterrupt, match=r"resume='.*last\.pt'"):
        learn.fit(2, cbs=[At(3, raise_sigint, event="after_pred")])

    assert position(tmp_path / "last.pt") == {
        "epoch": 0,
        "iter": 3,
        "train_iter": 3,
        "training_step": 3,
        "n_epoch": 2,
    }
    assert signal.getsignal(signal.SIGINT) is before  # the handler of before the fit is back
    err = capsys.readouterr().err
    assert "finishing this step and saving a checkpoint" in err
    assert "interrupted at epoch 1, step 3; checkpoint saved to" in err  # epochs read from 1


def test_second_sigint_stops_at_once_without_saving(tmp_path, capsys):
    learn = tiny_learner([Checkpoint(tmp_path, every_n_steps=2)])

    def press_twice(learn):
        raise_sigint(learn)
        raise_sigint(learn)

    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt, match="second Ctrl-C"):
        learn.fit(2, cbs=[At(3, press_twice, event="after_pred")])
    assert position(tmp_path / "last.pt")["training_step"] == 2
    assert signal.getsignal(signal.SIGINT) is before  # the handler of before the fit is back
    err = capsys.readouterr().err
    assert f"stopped by KeyboardInterrupt; the newest complete checkpoint is {tmp_path / 'last.pt'}" in err


class SigintInValidation(hs.Callback):
    def after_pred(self):
        if not self.learn.training and self.learn.epoch == 1 and self.learn.iter == 0:
            signal.raise_signal(signal.SIGINT)


def test_sigint_during_validation_saves_after_the_epoch(tmp_path, capsys):
    learn = tiny_learner([Checkpoint(tmp_path, every_epoch=False)])
    with pytest.raises(KeyboardInterrupt):
        learn.fit(3, cbs=[SigintInValidation()])
    assert position(tmp_path / "last.pt")["epoch"] == 2
    assert len(learn.recorder.history) == 2  # validation of epoch 1 completed before the stop
    assert "finishing this epoch's validation" in capsys.readouterr().err


def test_a_crash_prints_where_the_last_checkpoint_is(tmp_path, capsys):
    def boom(learn):
        raise RuntimeError("loss exploded")

    learn = tiny_learner([Checkpoint(tmp_path, every_n_steps=2)])
    with pytest.raises(RuntimeError, match="loss exploded"):
        learn.fit(2, cbs=[At(5, boom)])
    err = capsys.readouterr().err
    assert f"stopped by RuntimeError; the newest complete checkpoint is {tmp_path / 'last.pt'}" in err
    assert position(tmp_path / "last.pt")["training_step"] == 4


# ---- kill -9 and Ctrl-C of a real training process --------------------------------------------------


def run_script(*args):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def script_reference(tmp_path_factory):
    folder = tmp_path_factory.mktemp("reference")
    done = run_script(folder / "ckpt", "--out", folder / "final.safetensors")
    assert done.returncode == 0, done.stderr
    return load_file(folder / "final.safetensors")


def same_weights(reference, path):
    final = load_file(path)
    return set(final) == set(reference) and all(torch.equal(final[k], reference[k]) for k in reference)


# The seeds draw: after_batch mid-epoch, after_backward, after_batch of an epoch's last batch, and
# after_step (dead before that step's checkpoint) — each way of dying is covered.
@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 3, 38, 39])
def test_kill_9_at_a_random_step_then_resume_is_bitwise_equal(tmp_path, script_reference, seed):
    rng = random.Random(seed)
    step = rng.randrange(1, 21)  # 3 epochs of 7 batches: often mid-epoch, sometimes at an epoch's end
    event = rng.choice(["after_pred", "after_backward", "after_step", "after_batch"])
    loader = ["--plain-loader"] if seed % 2 else []
    out = tmp_path / "final.safetensors"

    killed = run_script(tmp_path, "--out", out, "--signal", "KILL", "--step", step, "--event", event, *loader)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not out.exists()
    resumed = run_script(tmp_path, "--out", out, "--resume", *loader)
    assert resumed.returncode == 0, resumed.stderr
    assert same_weights(script_reference, out), f"seed {seed}: killed at step {step} during {event}"


@pytest.mark.slow
def test_ctrl_c_saves_exits_non_zero_prints_the_hint_and_resumes_exactly(tmp_path, script_reference):
    out = tmp_path / "final.safetensors"
    interrupted = run_script(tmp_path, "--out", out, "--signal", "INT", "--step", 10, "--event", "after_pred")

    assert interrupted.returncode != 0
    assert f"resume='{tmp_path / 'last.pt'}'" in interrupted.stderr
    assert position(tmp_path / "last.pt")["training_step"] == 10
    resumed = run_script(tmp_path, "--out", out, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert same_weights(script_reference, out)
