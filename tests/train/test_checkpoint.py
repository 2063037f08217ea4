import collections
import io
import os
import random

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from small_learner import tiny_learner, weights
from torch import nn
from torch.utils.data import DataLoader

import hookscope as hs
from hookscope.atomic import atomic_write
from hookscope.train import checkpoint
from hookscope.train.checkpoint import (
    CheckpointError,
    capture_rng,
    load_checkpoint,
    restore_rng,
    write_checkpoint,
)
from hookscope.train.events import CancelFitException

pytestmark = pytest.mark.usefixtures("deterministic")  # bitwise-equal resume needs it (conftest.py)


def draws(generator):
    return (
        random.random(),
        random.gauss(0, 1),
        float(np.random.rand()),
        float(np.random.standard_normal()),
        torch.rand(3).tolist(),
        torch.randint(0, 1000, (3,), generator=generator).tolist(),
    )


# ---- RNG --------------------------------------------------------------------------------------------


def test_rng_state_round_trips_through_a_weights_only_file(tmp_path):
    gen = torch.Generator().manual_seed(7)
    random.gauss(0, 1)  # leaves a cached gaussian in python's and numpy's states
    np.random.standard_normal()
    state = capture_rng({"train.loader": gen})
    write_checkpoint({"rng": state}, tmp_path / "rng.pt")
    expected = draws(gen)

    restore_rng(load_checkpoint(tmp_path / "rng.pt")["rng"], {"train.loader": gen})
    assert draws(gen) == expected


def test_restore_rng_refuses_a_different_set_of_generators():
    state = capture_rng({"train.loader": torch.Generator()})
    with pytest.raises(
        CheckpointError, match=r"random generators \['train.loader'\] but the data now has \[\]"
    ):
        restore_rng(state, {})


# ---- files ------------------------------------------------------------------------------------------


def test_saved_learner_is_a_plain_weights_only_file(tmp_path):
    learn = tiny_learner()
    learn.fit(1)
    path = learn.save(tmp_path / "state.pt")

    raw = torch.load(path, weights_only=True)  # the format needs nothing but weights_only
    assert raw["format"] == "hookscope.checkpoint"
    assert set(raw["model"]) == set(learn.model.state_dict())
    assert raw["position"] == {"epoch": 1, "iter": 0, "train_iter": 5, "training_step": 5, "n_epoch": 1}
    assert raw["callbacks"]["recorder"]["history"][0]["epoch"] == 0
    assert isinstance(raw["rng"]["torch"], torch.Tensor)
    assert raw["rng"]["numpy"]["keys"].shape == (624,)
    assert list(tmp_path.iterdir()) == [path]  # no temp file left behind


def test_failed_write_leaves_the_previous_file_loadable(tmp_path):
    path = tmp_path / "state.pt"
    write_checkpoint({"value": torch.arange(4)}, path)

    def half_then_fail(file):
        file.write(b"PK\x03\x04 half a zip")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, half_then_fail)
    assert torch.equal(load_checkpoint(path)["value"], torch.arange(4))
    assert [p.name for p in tmp_path.iterdir()] == ["state.pt"]


def test_learner_save_failing_half_way_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    learn = tiny_learner()
    learn.fit(1)
    path = learn.save(tmp_path / "state.pt")
    before = load_checkpoint(path)["model"]
    learn.fit(1)

    real_save = torch.save

    def crash_half_way(obj, file):
        buffer = io.BytesIO()
        real_save(obj, buffer)
        file.write(buffer.getvalue()[: buffer.tell() // 2])
        raise OSError("killed during save")

    monkeypatch.setattr(torch, "save", crash_half_way)
    with pytest.raises(OSError, match="killed during save"):
        learn.save(path)
    monkeypatch.undo()
    after = load_checkpoint(path)["model"]
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_truncated_file_is_a_one_line_error_naming_the_file(tmp_path):
    path = tmp_path / "state.pt"
    write_checkpoint({"value": torch.ones(1000)}, path)
    path.write_bytes(path.read_bytes()[:3000])

    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path)
    message = str(err.value)
    assert "\n" not in message
    assert str(path) in message and "truncated or corrupt" in message


def test_flipped_byte_in_tensor_data_fails_the_checksum(tmp_path):
    path = tmp_path / "state.pt"
    write_checkpoint({"value": torch.ones(1000)}, path)
    data = bytearray(path.read_bytes())
    at = data.index(b"\x00\x00\x80\x3f" * 16)
    data[at + 2] ^= 0xFF
    path.write_bytes(bytes(data))

    with pytest.raises(CheckpointError, match=r"corrupt checkpoint \(checksum mismatch"):
        load_checkpoint(path)


class RunsCode:
    """Unpickling this would create a folder: proof that code ran."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def test_checkpoint_carrying_a_pickled_callable_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    torch.save(
        {"format": "hookscope.checkpoint", "version": 1, "model": {}, "x": RunsCode(str(marker))}, path
    )

    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path)
    message = str(err.value)
    assert "\n" not in message
    assert str(path) in message and "pickled Python object" in message and "posix.mkdir" in message
    assert not marker.exists()


def test_plain_state_dict_file_is_not_mistaken_for_a_checkpoint(tmp_path):
    path = tmp_path / "weights.pt"
    torch.save(nn.Linear(2, 2).state_dict(), path)
    with pytest.raises(CheckpointError, match="not a hookscope checkpoint"):
        load_checkpoint(path)


def test_missing_file_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no checkpoint at .*nope\.pt"):
        load_checkpoint(tmp_path / "nope.pt")


class BadState(hs.Callback):
    def __init__(self, value):
        self.value = value

    def state_dict(self):
        return {"value": self.value}


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (print, "builtins.builtin_function_or_method"),
        (np.float64(0.5), "numpy.float64"),
        (collections.defaultdict(int), "collections.defaultdict"),
    ],
)
def test_unloadable_callback_state_is_refused_at_save_naming_the_callback(tmp_path, value, kind):
    learn = tiny_learner(cbs=[BadState(value)])
    with pytest.raises(CheckpointError, match=rf"BadState.state_dict\(\)\['value'\] is a {kind}, which"):
        learn.save(tmp_path / "state.pt")
    assert not any(tmp_path.iterdir())


# ---- model weights ----------------------------------------------------------------------------------


def test_checkpoint_from_another_model_names_the_first_mismatching_keys(tmp_path):
    learn = tiny_learner()
    path = learn.save(tmp_path / "state.pt")
    other = hs.Learner(
        nn.Sequential(nn.Linear(6, 17), nn.ReLU(), nn.Linear(17, 3), nn.Linear(3, 3)),
        learn.dls,
        nn.CrossEntropyLoss(),
        progress=False,
    )
    before = weights(other)
    with pytest.raises(CheckpointError) as err:
        other.load(path)
    assert all(torch.equal(a, b) for a, b in zip(before, weights(other), strict=True))  # nothing changed
    message = str(err.value)
    assert "\n" not in message and str(path) in message
    assert "missing keys 2.weight, 2.bias; " in message
    assert "shape mismatch 0.weight (16, 6) in file vs (17, 6) in model, 0.bias" in message
    assert "3.weight (3, 16) in file vs (3, 3) in model; build the same architecture" in message


def test_checkpoint_from_another_optimizer_is_refused_in_one_line(tmp_path):
    learn = tiny_learner()
    learn.fit(1)
    path = learn.save(tmp_path / "state.pt")
    other = tiny_learner()
    other.opt_func = torch.optim.SGD
    with pytest.raises(
        CheckpointError, match=r"holds AdamW optimizer state but this Learner uses SGD; pass opt_func=AdamW"
    ):
        other.load(path)

    two_groups = tiny_learner()
    layers = two_groups.model
    two_groups.opt = torch.optim.AdamW(
        [{"params": layers[0].parameters()}, {"params": layers[3].parameters()}]
    )
    with pytest.raises(
        CheckpointError,
        match=r"state.pt: parameter groups of \[4\] parameters in the file vs \[2, 2\] in this optimizer",
    ):
        two_groups.load(path)


def test_export_safetensors_round_trips_and_handles_tied_weights(tmp_path):
    model = nn.Sequential(nn.Embedding(5, 4), nn.Linear(4, 5, bias=False))
    model[1].weight = model[0].weight  # tied, as in language models
    path = hs.export_safetensors(model, tmp_path / "w.safetensors")

    loaded = load_file(path)
    assert set(loaded) == {"0.weight", "1.weight"}
    assert torch.equal(loaded["1.weight"], model[0].weight.detach())
    fresh = nn.Sequential(nn.Embedding(5, 4), nn.Linear(4, 5, bias=False))
    fresh.load_state_dict(loaded)
    assert torch.equal(fresh[1].weight, model[1].weight)


# ---- Learner.save / load / fit(resume=) -------------------------------------------------------------


def test_load_restores_model_optimizer_and_recorder(tmp_path):
    learn = tiny_learner(seed=0)
    learn.fit(2)
    path = learn.save(tmp_path / "state.pt")

    other = tiny_learner(seed=5)
    other.load(path)
    assert all(torch.equal(a, b) for a, b in zip(weights(learn), weights(other), strict=True))
    saved, loaded = learn.opt.state_dict(), other.opt.state_dict()
    assert all(torch.equal(saved["state"][0][k], loaded["state"][0][k]) for k in ("exp_avg", "exp_avg_sq"))
    assert [row["train_loss"] for row in other.recorder.history] == [
        row["train_loss"] for row in learn.recorder.history
    ]


class SaveThenStop(hs.Callback):
    """Saves with ``learn.save`` at the end of epoch ``epoch`` and stops the fit there."""

    def __init__(self, path, epoch):
        self.path, self.epoch = path, epoch

    def after_epoch(self):
        if self.learn.epoch == self.epoch:
            self.learn.save(self.path)
            raise CancelFitException()


@pytest.mark.parametrize("in_memory", [True, False])
def test_resume_between_epochs_is_bitwise_equal_to_an_uninterrupted_run(tmp_path, in_memory):
    gen = torch.Generator().manual_seed(3)
    reference = tiny_learner(in_memory=in_memory, generator=gen)
    reference.fit_one_cycle(3, lr_max=0.05)

    gen = torch.Generator().manual_seed(3)
    first = tiny_learner(in_memory=in_memory, generator=gen)
    first.fit_one_cycle(3, lr_max=0.05, cbs=[SaveThenStop(tmp_path / "state.pt", epoch=0)])
    torch.manual_seed(42)  # the resumed process starts elsewhere; the checkpoint must put every RNG back
    gen = torch.Generator().manual_seed(11)
    resumed = tiny_learner(seed=9, in_memory=in_memory, generator=gen)
    resumed.fit_one_cycle(3, lr_max=0.05, resume=tmp_path / "state.pt")

    assert all(torch.equal(a, b) for a, b in zip(weights(reference), weights(resumed), strict=True))
    assert resumed.training_step == reference.training_step == 15
    assert [r["epoch"] for r in resumed.recorder.history] == [0, 1, 2]
    assert resumed.recorder.history[1]["valid_loss"] == reference.recorder.history[1]["valid_loss"]


def test_resume_with_another_epoch_count_warns(tmp_path):
    learn = tiny_learner()
    learn.fit(1)
    path = learn.save(tmp_path / "state.pt")
    with pytest.warns(UserWarning, match=r"saved during fit\(1\) and is resumed with fit\(2\)"):
        tiny_learner().fit(2, resume=path)


def test_resume_with_persistent_workers_warns_that_worker_randomness_differs(tmp_path):
    learn = tiny_learner()
    learn.fit(1)
    path = learn.save(tmp_path / "state.pt")
    persistent = tiny_learner()
    train = persistent.dls.train
    persistent.dls.train = DataLoader(train.dataset, batch_size=8, num_workers=1, persistent_workers=True)
    with pytest.warns(UserWarning, match="persistent_workers=True: the new worker processes start fresh"):
        persistent.fit(1, resume=path)  # already at the end: no epoch runs, no worker starts


def test_resume_last_without_a_checkpoint_callback_says_what_to_do():
    with pytest.raises(ValueError, match="no Checkpoint callback; add cbs="):
        tiny_learner().fit(1, resume="last")


def test_resume_from_a_folder_reads_its_last_pt(tmp_path):
    learn = tiny_learner()
    learn.fit(1)
    learn.save(tmp_path / "checkpoints" / "last.pt")
    assert checkpoint.find_latest(tmp_path) == tmp_path / "checkpoints" / "last.pt"
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"no last\.pt in .*empty"):
        checkpoint.find_latest(tmp_path / "empty")
