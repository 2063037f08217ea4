import functools
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


def test_show_training_loop_names_the_callbacks_that_cost_times(capsys):
    # CallbackCost's timers and the doctor's stacked over the same methods
    learn = _learner([hs.callbacks.CallbackCost(), hs.callbacks.Doctor(quiet=True), Quick()])
    learn.fit(1)
    learn.show_training_loop()
    lines = [line.split(maxsplit=1) for line in capsys.readouterr().out.splitlines()]
    assert ["before_batch", "Quick, Doctor, NonFiniteGuard"] in lines
    assert ["after_fit", "CallbackCost, Doctor, NonFiniteGuard"] in lines
    assert ["after_cancel_fit", "Doctor"] in lines


class WrapsFirst(hs.Callback):
    """Wraps every event method before CallbackCost does (a lower order), without ``__self__``."""

    order = -200

    def wrap_method(self, event, method):
        @functools.wraps(method)
        def wrapped(*args):
            return method(*args)

        return wrapped


def test_costs_are_keyed_by_the_callback_under_another_wrapper():
    cost = hs.callbacks.CallbackCost()
    _learner([WrapsFirst(), cost, Quick()]).fit(1)
    assert cost.costs["quick"]["before_batch"]["calls"] == 6
    assert "callback_cost" not in cost.costs
