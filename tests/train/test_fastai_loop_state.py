"""The loop state under fastai's names means what it means in fastai (TrainEvalCallback, LRFinder)."""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hookscope as hs
from hookscope.train.events import CancelFitException


def _learner(cbs=(), n_train=8, batch_size=4, **kwargs):
    torch.manual_seed(0)
    x, y = torch.randn(n_train + 4, 3), torch.randint(0, 2, (n_train + 4,))
    train = DataLoader(TensorDataset(x[:n_train], y[:n_train]), batch_size=batch_size)
    valid = DataLoader(TensorDataset(x[n_train:], y[n_train:]), batch_size=4)
    return hs.Learner(
        nn.Linear(3, 2), (train, valid), nn.CrossEntropyLoss(), cbs=cbs, progress=False, **kwargs
    )


class PctLog(hs.Callback):
    """Records (event, train_iter, pct_train) at the events where fastai's values are documented."""

    def __init__(self):
        self.seen = []

    def _log(self, event):
        self.seen.append((event, self.learn.train_iter, self.learn.pct_train))

    def before_train(self):
        self._log("before_train")

    def after_batch(self):
        if self.learn.training:
            self._log("after_batch")

    def after_fit(self):
        self._log("after_fit")


def test_after_batch_sees_the_batch_it_follows_counted():
    log = PctLog()
    _learner(cbs=[log]).fit(2)
    after_batch = [(it, pct) for event, it, pct in log.seen if event == "after_batch"]
    assert after_batch == [(1, 0.25), (2, 0.5), (3, 0.75), (4, 1.0)]


def test_pct_train_is_exact_at_before_train_and_one_at_after_fit():
    log = PctLog()
    _learner(cbs=[log]).fit(2)
    assert [pct for event, _, pct in log.seen if event == "before_train"] == [0.0, 0.5]
    assert log.seen[-1] == ("after_fit", 4, 1.0)


def test_fastai_lr_finder_stop_test_stops_after_num_it_batches():
    class StopAfter(hs.Callback):  # fastai's LRFinder.after_batch: `if self.train_iter >= self.num_it`
        num_it = 3

        def after_batch(self):
            if self.learn.train_iter >= self.num_it:
                raise CancelFitException()

    learn = _learner(cbs=[StopAfter()], n_train=40)
    learn.fit(1)
    assert learn.training_step == 3


def test_scaling_loss_grad_in_place_leaves_the_recorded_loss_alone():
    class HalveLoss(hs.Callback):
        def after_loss(self):
            self.learn.loss_grad *= 0.5  # in place: a view of loss_grad would change with it

        def after_batch(self):
            if self.learn.training:
                unscaled = self.learn.loss_func(self.learn.pred, *self.learn.yb)
                self.checked.append(torch.equal(self.learn.loss, unscaled.detach()))

    halve = HalveLoss()
    halve.checked = []
    _learner(cbs=[halve]).fit(1)
    assert halve.checked == [True, True]


def test_every_fit_starts_from_learn_lr_after_a_schedule():
    class LrAtFirstBatch(hs.Callback):
        def before_fit(self):
            self.lrs = []

        def before_batch(self):
            if self.learn.training:
                self.lrs.append(self.learn.opt.param_groups[0]["lr"])

    learn = _learner(lr=0.01)
    learn.fit_one_cycle(1)
    watch = LrAtFirstBatch()
    learn.fit(1, cbs=[watch])
    assert watch.lrs == [0.01, 0.01]
    learn.fit(1, lr=0.003, cbs=[watch])
    assert watch.lrs == [0.003, 0.003] and learn.lr == 0.003
