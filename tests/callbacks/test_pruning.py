"""hs.callbacks.Pruning: Zhu & Gupta's cubic schedule, any `how`, lottery-ticket rewind, exact resume."""

import json

import pytest
import torch
from small_learner import tiny_learner, weights
from torch import nn

import hookscope as hs
from hookscope.callbacks import Checkpoint, Pruning
from hookscope.callbacks.pruning import cubic_sparsity
from hookscope.train.checkpoint import CheckpointError
from hookscope.train.events import CancelFitException

pytestmark = pytest.mark.usefixtures("deterministic")  # bitwise-equal resume needs it (conftest.py)
BATCHES = 5  # per epoch in tiny_learner


class StopAt(hs.Callback):
    order = 100

    def __init__(self, step: int) -> None:
        self.step = step

    def after_batch(self) -> None:
        if self.learn.training and self.learn.training_step == self.step:
            raise CancelFitException()


def test_cubic_schedule_matches_zhu_and_gupta() -> None:
    assert cubic_sparsity(0, 0.0, 0.8, 0, 10) == 0.0
    assert cubic_sparsity(5, 0.0, 0.8, 0, 10) == pytest.approx(0.8 - 0.8 * 0.5**3)
    assert cubic_sparsity(10, 0.0, 0.8, 0, 10) == 0.8
    assert cubic_sparsity(12, 0.1, 0.8, 2, 10) == 0.8


@pytest.mark.parametrize("how", ["l1", "random", "activation", "taylor"])
def test_gradual_pruning_follows_the_schedule_and_reaches_the_final_sparsity(how: str) -> None:
    pruning = Pruning(nn.Linear, 0.8, start_step=2, end_step=10, every=3, how=how)
    learn = tiny_learner([pruning])
    learn.fit(3)
    assert [entry[0] for entry in pruning.log] == [2, 5, 8, 10]
    for step, target, reached in pruning.log:
        assert target == pytest.approx(cubic_sparsity(step, 0.0, 0.8, 2, 10))
        assert reached == pytest.approx(target, abs=0.01)
    assert pruning.table().total == pytest.approx(0.8, abs=0.01)
    first = learn.model[0]
    assert torch.all(first.weight[first.weight_mask == 0] == 0)


def test_structured_global_pruning_during_training() -> None:
    pruning = Pruning(nn.Linear, 0.5, end_step=6, every=2, structured=True, scope="global", how="activation")
    learn = tiny_learner([pruning])
    learn.fit(2)
    rows = pruning.table().rows
    assert sum(r.channels_pruned for r in rows if r.param == "weight") == round(0.5 * (16 + 3))


class ParamsAt(hs.Callback):
    """The model's parameters at ``before_batch`` of training step ``step`` (``order`` picks whether before or
    after the Pruning callback at that event), keyed by their name before pruning."""

    def __init__(self, step: int, order: int) -> None:
        self.step, self.order, self.params = step, order, {}

    def before_batch(self) -> None:
        if self.learn.training and self.learn.training_step == self.step:
            model = self.learn.model
            self.params = {n.removesuffix("_orig"): p.detach().clone() for n, p in model.named_parameters()}


def test_lottery_ticket_rewind_resets_survivors_to_their_early_values() -> None:
    class ParamsAfterPruning(ParamsAt):  # a second name: the Learner keys callbacks by name
        pass

    early, rewound = ParamsAt(1, order=-1), ParamsAfterPruning(4, order=1)
    pruning = Pruning(nn.Linear, 0.6, end_step=4, every=2, rewind_step=1)
    learn = tiny_learner([early, pruning, rewound])
    learn.fit(1)
    assert [entry[0] for entry in pruning.log] == [0, 2, 4]
    assert set(rewound.params) == {"0.weight", "0.bias", "3.weight", "3.bias"}
    for name, value in rewound.params.items():
        assert torch.equal(value, early.params[name])
    state = pruning.state_dict()
    assert state["rewound"] and state["snapshot"] is None
    first = learn.model[0]
    assert torch.all(first.weight[first.weight_mask == 0] == 0)
    assert not torch.equal(first.weight_orig, early.params["0.weight"])  # training went on after the rewind


@pytest.mark.parametrize("stop_at", [3, 7])
@pytest.mark.parametrize("how", ["l1", "random", "taylor"])
def test_pruning_with_checkpoint_resumes_bitwise_into_a_fresh_model(tmp_path, how: str, stop_at: int) -> None:
    def learner(seed: int = 0) -> hs.Learner:
        cbs = [
            Pruning(nn.Linear, 0.7, end_step=9, every=2, how=how, rewind_step=1),
            Checkpoint(tmp_path, every_n_steps=1),
        ]
        return tiny_learner(cbs, seed=seed)

    reference = learner()
    reference.fit(3)
    expected = weights(reference)

    first = learner()
    first.fit(3, cbs=[StopAt(stop_at)])
    resumed = learner(seed=5)  # a fresh, unpruned model: the checkpoint brings the masks back
    assert not hasattr(resumed.model[0], "weight_mask")
    resumed.fit(3, resume="last")
    assert resumed.training_step == 3 * BATCHES
    assert all(torch.equal(a, b) for a, b in zip(expected, weights(resumed), strict=True))
    assert torch.equal(resumed.model[0].weight_mask, reference.model[0].weight_mask)
    assert resumed.pruning.log == reference.pruning.log


def test_pruned_checkpoint_loads_into_a_fresh_model_and_an_unpruned_one_is_refused_clearly(tmp_path) -> None:
    learn = tiny_learner([Pruning(nn.Linear, 0.5, end_step=2, every=1)])
    learn.fit(1)
    path = learn.save(tmp_path / "pruned.pt")
    fresh = tiny_learner(seed=3)
    with pytest.warns(UserWarning, match=r"callbacks \['pruning'\] that this Learner does not have"):
        fresh.load(path)
    assert torch.equal(fresh.model[0].weight, learn.model[0].weight)
    assert hs.sparsity(fresh.model, nn.Linear).total == pytest.approx(0.5, abs=0.01)

    plain = tiny_learner().save(tmp_path / "plain.pt")
    with pytest.raises(CheckpointError, match="this model is pruned and the file is not"):
        learn.load(plain)


def test_bad_schedules_are_refused() -> None:
    with pytest.raises(ValueError, match="initial_sparsity"):
        Pruning(nn.Linear, 0.3, initial_sparsity=0.5)
    with pytest.raises(ValueError, match="end_step=2 must come after start_step=5"):
        Pruning(nn.Linear, 0.5, start_step=5, end_step=2)
    with pytest.raises(ValueError, match="rewind_step=9"):
        Pruning(nn.Linear, 0.5, end_step=4, rewind_step=9)


def test_the_run_folder_report_gets_a_pruning_section(tmp_path) -> None:
    pruning = Pruning(nn.Linear, 0.5, end_step=4, every=2, how="activation")
    learn = tiny_learner([pruning, hs.callbacks.RunFolder(tmp_path / "run", figures=False)])
    learn.fit(1)
    record = json.loads((tmp_path / "run" / "pruning.json").read_text())
    assert record["sparsity"]["total"] == pytest.approx(0.5, abs=0.01)
    assert [entry[0] for entry in record["log"]] == [0, 2, 4]
    report = (tmp_path / "run" / "report.html").read_text()
    assert "<h2>Pruning</h2>" in report and "Unstructured activation pruning" in report


def test_no_pruning_section_without_the_callback(tmp_path) -> None:
    tiny_learner([hs.callbacks.RunFolder(tmp_path / "run", figures=False)]).fit(1)
    assert not (tmp_path / "run" / "pruning.json").exists()
    assert "<h2>Pruning</h2>" not in (tmp_path / "run" / "report.html").read_text()
