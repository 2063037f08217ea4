"""Resume knows whose checkpoint it is: another run's checkpoint (other model, data or config) is refused
naming what differs, unless asked for; checkpoints from before identities still resume, warning once."""

import warnings

import pytest
import torch
from small_learner import tiny_learner
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hookscope as hs
from hookscope.train import checkpoint
from hookscope.train.checkpoint import CheckpointError, identity


@pytest.fixture
def saved(tmp_path):
    """A checkpoint of the tiny run after one epoch."""
    tiny_learner([hs.callbacks.Checkpoint(tmp_path)]).fit(1)
    return tmp_path / "last.pt"


def test_the_same_run_resumes_from_its_own_checkpoint(saved):
    learn = tiny_learner([hs.callbacks.Checkpoint(saved.parent)])
    learn.fit(2, resume="last")
    assert len(learn.recorder.history) == 2
    assert checkpoint.load_checkpoint(saved)["identity"] == checkpoint.run_identity(learn)


def test_another_config_is_refused_naming_the_difference(saved):
    learn = tiny_learner([hs.callbacks.Checkpoint(saved.parent)])
    learn.lr = 0.1
    before = [p.detach().clone() for p in learn.model.parameters()]
    with pytest.raises(CheckpointError, match=r"is a checkpoint of another run \(lr: 0.01 there, 0.1 here\)"):
        learn.fit(2, resume="last")
    assert all(torch.equal(a, b) for a, b in zip(before, learn.model.parameters(), strict=True))


def test_other_data_is_refused_naming_its_sizes(saved):
    learn = tiny_learner()
    x, y = torch.randn(24, 6), torch.randint(0, 3, (24,))
    learn.dls = hs.DataLoaders(DataLoader(TensorDataset(x, y), batch_size=8), learn.dls.valid)
    with pytest.raises(CheckpointError) as refused:
        learn.fit(2, resume=saved)
    message = str(refused.value)
    assert "train data samples: 40 there, 24 here" in message
    assert "Checkpoint(..., allow_other_run=True)" in message and "--weights" in message


def test_same_sizes_other_values_are_told_apart_by_the_hash(saved):
    learn = tiny_learner()
    train = learn.dls.train.dataset.tensors
    shifted = TensorDataset(train[0] + 1.0, train[1])
    learn.dls = hs.DataLoaders(DataLoader(shifted, batch_size=8, shuffle=True), learn.dls.valid)
    with pytest.raises(CheckpointError, match=r"train data crc: \d+ there, \d+ here"):
        learn.fit(2, resume=saved)


def test_another_model_is_refused_before_its_weights_are_checked(saved):
    learn = tiny_learner()
    learn.model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Dropout(0.25), nn.Linear(16, 3))
    learn.opt = None
    differs = r"another run \(model: Sequential-\w+ there, Sequential-\w+ here"
    with pytest.raises(CheckpointError, match=differs):
        learn.fit(2, resume=saved)


def test_another_run_resumes_when_asked_explicitly(saved):
    learn = tiny_learner([hs.callbacks.Checkpoint(saved.parent, allow_other_run=True)])
    learn.lr = 0.1
    learn.fit(2, resume="last")
    assert len(learn.recorder.history) == 2


def test_a_checkpoint_without_identity_resumes_and_warns_once(saved, monkeypatch):
    state = checkpoint.load_checkpoint(saved)
    for key in ("format", "version", "checksum", "identity"):
        state.pop(key)
    checkpoint.write_checkpoint(state, saved.parent / "old.pt")
    monkeypatch.setattr(identity, "_warned_without_identity", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tiny_learner().fit(2, resume=saved.parent / "old.pt")
        tiny_learner().fit(2, resume=saved.parent / "old.pt")
    told = [w for w in caught if "records no run identity" in str(w.message)]
    assert len(told) == 1
