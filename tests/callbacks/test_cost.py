import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hookscope as hs


class Sleepy(hs.Callback):
    def after_batch(self):
        time.sleep(0.002)


class Quick(hs.Callback):
    def before_batch(self):
        pass


def _learner(cbs):
    x, y = torch.randn(32, 3), torch.randn(32, 1)
    dls = (DataLoader(TensorDataset(x, y), batch_size=8), DataLoader(TensorDataset(x, y), batch_size=16))
    return hs.Learner(nn.Linear(3, 1), dls, nn.MSELoss(), cbs=cbs, progress=False)


def test_costs_count_every_call_per_callback_and_event():
    cost = hs.callbacks.CallbackCost()
    learn = _learner([cost, Sleepy(), Quick()])
    learn.fit(2)
    costs = cost.costs
    # 4 training + 2 validation batches per epoch, two epochs
    assert costs["sleepy"]["after_batch"]["calls"] == 12
    assert costs["quick"]["before_batch"]["calls"] == 12
    assert costs["recorder"]["after_epoch"]["calls"] == 2
    assert "callback_cost" not in costs
    assert costs["sleepy"]["after_batch"]["seconds"] >= 12 * 0.002
    assert costs["sleepy"]["after_batch"]["seconds"] > costs["quick"]["before_batch"]["seconds"]
    assert 0 < sum(e["seconds"] for c in costs.values() for e in c.values()) <= cost.fit_seconds


def test_report_lists_the_most_expensive_first_and_show_prints_it(capsys):
    cost = hs.callbacks.CallbackCost(show=True)
    _learner([cost, Sleepy(), Quick()]).fit(1)
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].split()[:3] == ["callback", "event", "calls"]
    assert printed[1].split()[:3] == ["sleepy", "after_batch", "6"]
    assert printed == cost.report().splitlines()


def test_timing_does_not_change_training():
    torch.manual_seed(0)
    plain = _learner([])
    plain.fit(1)
    torch.manual_seed(0)
    timed = _learner([hs.callbacks.CallbackCost()])
    timed.fit(1)
    for a, b in zip(plain.model.parameters(), timed.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert plain.recorder.losses == timed.recorder.losses


def test_costs_start_afresh_at_each_fit():
    cost = hs.callbacks.CallbackCost()
    learn = _learner([cost, Quick()])
    learn.fit(1)
    learn.fit(1)
    assert cost.costs["quick"]["before_batch"]["calls"] == 6
