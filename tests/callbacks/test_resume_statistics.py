"""A resumed run keeps the Doctor's findings and the statistics histories of the part before the stop."""

import pytest
import torch
from faults import Branches, digits_flat, mlp
from torch import nn

import hookscope as hs
from hookscope.callbacks import Checkpoint
from hookscope.doctor import history_codec
from hookscope.train.checkpoint import load_checkpoint
from hookscope.train.events import CancelFitException

EVERY_N_STEPS = 2


pytestmark = pytest.mark.usefixtures("deterministic")  # bitwise-equal resume needs it (conftest.py)


class RaiseAfter(hs.Callback):
    """Fails the fit once ``step`` training steps are done (after the Checkpoint saved that step)."""

    order = 100

    def __init__(self, step: int) -> None:
        self.step = step

    def after_batch(self) -> None:
        if self.learn.training and self.learn.training_step == self.step:
            raise RuntimeError("interrupted")


def _dead_mlp() -> nn.Module:
    torch.manual_seed(0)
    model = mlp(depth=3)
    with torch.no_grad():
        model[2].bias.fill_(-10.0)  # layer 3 (the ReLU after it) is dead from step 0
    return model


def _learner(folder, *extra: hs.Callback) -> hs.Learner:
    cbs = [hs.callbacks.Doctor(check_every=4), Checkpoint(folder, every_n_steps=EVERY_N_STEPS), *extra]
    return hs.Learner(_dead_mlp(), digits_flat(), nn.CrossEntropyLoss(), cbs=cbs, progress=False)


def _findings(learn: hs.Learner) -> list[tuple[str, str, int]]:
    return [(f.kind, f.module, f.step) for f in learn.doctor.findings]


def _histories(learn: hs.Learner) -> dict[str, object]:
    doctor = learn.doctor
    return {
        "activations": {
            name: [(r.step, r.stats.mean, r.stats.channel_rms.tolist()) for r in records]
            for name, records in doctor.activations.history.items()
        },
        "output_grads": {
            name: [(r.step, r.stats.std, r.stats.histogram.tolist()) for r in records]
            for name, records in doctor.gradients.history.items()
        },
        "params": doctor.gradients.param_history,
        "loss": doctor.engine.loss_history,
    }


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    torch.use_deterministic_algorithms(True)
    learn = _learner(tmp_path_factory.mktemp("full"))
    learn.fit(1)
    return learn


# step 2: dead_units is first reported after the resume (check at step 4) and must be dated step 0;
# step 6: it was printed before the stop and must not be printed again
@pytest.mark.parametrize("stop", [2, 6])
def test_doctor_resumed_mid_epoch_matches_an_uninterrupted_run(stop, uninterrupted, tmp_path, capsys):
    capsys.readouterr()
    with pytest.raises(RuntimeError, match="interrupted"):
        _learner(tmp_path, RaiseAfter(stop)).fit(1)
    first_part = capsys.readouterr().err

    resumed = _learner(tmp_path)
    resumed.fit(1, resume=tmp_path)
    second_part = capsys.readouterr().err

    for name, value in uninterrupted.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[name], value), name
    # the training loader reads in order: the fresh fit says so (info), the resumed one keeps it
    expected = [("unshuffled_data", "", 0), ("dead_units", "3", 0)]
    assert _findings(resumed) == _findings(uninterrupted) == expected
    assert (first_part + second_part).count("dead_units") == 1
    assert ("dead_units" in first_part) == (stop > 4)
    assert _histories(resumed) == _histories(uninterrupted)
    assert all(records[0].step == 0 for records in resumed.doctor.activations.history.values())


def test_statistics_state_is_plain_and_round_trips(tmp_path):
    # Branches: a parameter without gradient (None norms); history=4 thins and doubles the interval
    activations = hs.callbacks.ActivationStats(history=4, include_valid=True)
    gradients = hs.callbacks.GradientStats(history=4, output_grads=True)
    torch.manual_seed(0)
    learn = hs.Learner(
        Branches(),
        hs.DataLoaders(digits_flat().train, digits_flat().train),
        nn.CrossEntropyLoss(),
        cbs=[activations, gradients, Checkpoint(tmp_path, every_epoch=True)],
        progress=False,
    )
    learn.fit(1)
    saved = load_checkpoint(tmp_path / "last.pt")["callbacks"]

    restored_acts = hs.callbacks.ActivationStats(history=4, include_valid=True)
    restored_grads = hs.callbacks.GradientStats(history=4, output_grads=True)
    restored_acts.load_state_dict(saved["activation_stats"])
    restored_grads.load_state_dict(saved["gradient_stats"])

    assert activations.every > 1 and restored_acts.every == activations.every
    assert restored_grads.every == gradients.every
    assert _stats(restored_acts.history) == _stats(activations.history)
    assert _stats(restored_acts.valid_history) == _stats(activations.valid_history) != {}
    assert _stats(restored_grads.history) == _stats(gradients.history)
    assert restored_grads.param_history == gradients.param_history
    assert restored_grads.param_history["unused.weight"][0].grad_norm is None


def _stats(history) -> dict[str, list]:
    fields = ("count", "mean", "std", "abs_max", "zero_fraction", "nonfinite", "sampled")
    arrays = ("histogram", "channel_rms", "edges")
    return {
        name: [
            (r.step, *(getattr(r.stats, f) for f in fields), *(getattr(r.stats, a).tolist() for a in arrays))
            for r in records
        ]
        for name, records in history.items()
    }


def test_a_checkpoint_thins_long_histories_to_saved_records(tmp_path, monkeypatch):
    monkeypatch.setattr(history_codec, "SAVED_RECORDS", 4)
    activations, gradients = hs.callbacks.ActivationStats(), hs.callbacks.GradientStats()
    torch.manual_seed(0)
    cbs = [activations, gradients, Checkpoint(tmp_path)]
    hs.Learner(mlp(depth=2), digits_flat(), nn.CrossEntropyLoss(), cbs=cbs, progress=False).fit(1)
    saved = load_checkpoint(tmp_path / "last.pt")["callbacks"]

    restored = hs.callbacks.ActivationStats()
    restored.load_state_dict(saved["activation_stats"])
    # 23 records per layer: every 8th (steps 0, 8, 16) fits 4, the same records repeated halving keeps
    assert restored.every == 8 and saved["gradient_stats"]["thinnings"] == 3
    assert _stats(restored.history) == {n: _stats(activations.history)[n][::8] for n in activations.history}
    assert all(len(c["step"]) == 3 for c in saved["gradient_stats"]["param_history"].values())


class GuardStates(hs.Callback):
    """Keeps the guard's checkpoint state after every training batch."""

    order = 100

    def __init__(self) -> None:
        self.states: list[dict] = []

    def after_batch(self) -> None:
        if self.learn.training:
            self.states.append(self.learn.non_finite_guard.state_dict())


def _guarded(guard: hs.Callback, *extra: hs.Callback) -> hs.Learner:
    torch.manual_seed(0)
    cbs = [guard, hs.callbacks.GradientAccumulation(2), *extra]
    return hs.Learner(mlp(depth=2), digits_flat(), nn.CrossEntropyLoss(), cbs=cbs, progress=False)


def test_guard_keeps_an_unchecked_accumulation_group_across_a_resume():
    from hookscope.callbacks.guard import NonFiniteGuard

    states = GuardStates()
    _guarded(NonFiniteGuard(quiet=True), states, StopAt(4)).fit(1)
    # nothing to keep after a checked step; mid-group: the flags so far and the group's start buffers
    assert states.states[1] == states.states[3] == {}
    assert set(states.states[0]) == {"activation_ok", "loss_ok", "buffers"}

    mid_group = dict(states.states[2], loss_ok=[torch.tensor(False)])  # a NaN loss before the stop
    guard = NonFiniteGuard(quiet=True)
    guard.load_state_dict(mid_group)
    _guarded(guard).fit(1)
    assert (guard.stopped_at, guard.reason) == (0, "loss")


class StopAt(hs.Callback):
    order = 100

    def __init__(self, batches: int) -> None:
        self.batches = batches

    def after_batch(self) -> None:
        self.batches -= 1
        if self.batches == 0:
            raise CancelFitException()
