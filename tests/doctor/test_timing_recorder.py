"""The TimingRecorder as a whole: the phases of a step add up to its time and land where the loop spent
it; validation belongs to no step; a resumed run goes on from a state a checkpoint loads safely; closing
removes its hooks and the collector's callback."""

import gc
import io
import time

import pytest
import torch
from timing_loops import Feed, SlowImages, cnn, in_memory, run, stall_every, train
from torch import nn
from torch.utils.data import DataLoader

from hookscope import Learner
from hookscope.doctor.timing import TimingRecorder
from hookscope.doctor.timing.phases import COLUMNS, STEP_PHASES
from hookscope.train.callback import Callback

pytestmark = pytest.mark.serial  # they measure time: run alone (`make test`'s second part)


class Sleepy(nn.Module):
    """A model whose forward takes ``seconds``; its loss then sleeps in backward as long as asked."""

    def __init__(self, seconds):
        super().__init__()
        self.seconds = seconds
        self.layer = nn.Linear(4, 1)

    def forward(self, x):
        time.sleep(self.seconds)
        return self.layer(x)


def _feed_one_step(recorder, model, opt, data_s, backward_s, optimizer_s, other_s, step):
    time.sleep(data_s)
    loss = model(torch.ones(2, 4)).sum()
    recorder.log_loss(loss, training=True)
    time.sleep(backward_s)
    loss.backward()
    recorder.gradients_ready()
    time.sleep(optimizer_s)
    opt.step()
    recorder.step_done()
    time.sleep(other_s)
    recorder.end_batch()
    recorder.begin_batch(step + 1, training=True)


def test_each_phase_gets_the_time_spent_in_it():
    model = Sleepy(0.010)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    recorder = TimingRecorder(warmup=1)
    recorder.attach(model)
    recorder.begin_batch(0, training=True)
    for step in range(4):
        _feed_one_step(recorder, model, opt, 0.020, 0.015, 0.005, 0.008, step)
    recorder.close()
    steps, rows = recorder.recent.view()
    assert steps.tolist() == [1, 2, 3]
    expected = [0.020, 0.010, 0.015, 0.005, 0.008]
    for row in rows:
        for got, want in zip(row[:STEP_PHASES], expected, strict=True):
            assert want <= got <= want + 0.05  # a sleep never ends early; a busy machine adds to it
    assert recorder.steps_read == 4


def test_without_the_roots_hooks_begin_batch_and_the_loss_bound_the_forward():
    """A framework that calls a submodule: the loop's begin_batch starts the forward, the loss ends it."""
    model = Sleepy(0.010)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    recorder = TimingRecorder(warmup=0)
    recorder.attach(nn.Identity())  # the model the loop runs is not the one attached
    time.sleep(0.020)  # the loader
    recorder.begin_batch(0, training=True)
    loss = model(torch.ones(2, 4)).sum()
    recorder.log_loss(loss, training=True)
    loss.backward()
    recorder.gradients_ready()
    opt.step()
    recorder.step_done()
    recorder.end_batch()
    recorder.close()
    _, rows = recorder.recent.view()
    data, forward = rows[0, COLUMNS.index("data")], rows[0, COLUMNS.index("forward")]
    assert 0.020 <= data < 0.030 and 0.010 <= forward < 0.020


def test_validation_between_steps_belongs_to_no_step():
    loader = in_memory()
    model = cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    feed = Feed(model, opt, warmup=0)
    train(model, opt, feed, loader, 3)
    model.eval()
    with torch.no_grad():  # hs.watch's loop validates without telling: the eval forward says so
        for _ in range(2):
            model(torch.randn(4, 1, 16, 16))
            time.sleep(0.05)  # the next validation batch, the metrics
    model.train()
    train(model, opt, feed, loader, 2)
    feed.close()
    _, rows = feed.recorder.recent.view()
    valid = rows[:, COLUMNS.index("valid")]
    assert valid[3] >= 0.1 and rows[3, COLUMNS.index("data")] < 0.05
    assert valid[[0, 1, 2, 4]].sum() == 0


def test_a_resumed_run_finds_what_an_uninterrupted_one_finds():
    """Stalls every 25 steps, found alike with a resume at step 60 between them; the resumed process's own
    warm-up is no stall."""
    stall = stall_every(25, 0.3)
    whole = run(in_memory(), 110, stall).close()
    assert [(f.kind, f.step, f.evidence["period"]) for f in whole] == [("step_stalls", 100, 25)]

    model = cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = in_memory()
    first = Feed(model, opt)
    train(model, opt, first, loader, 60, stall)
    buffer = io.BytesIO()
    torch.save(first.recorder.state_dict(), buffer)
    found = first.close()
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)  # what a checkpoint loads
    time.sleep(0.3)  # the restart: no step's time
    second = Feed(model, opt, start=60, state=state)
    resumed = warm_up_then(stall)
    train(model, opt, second, loader, 50, lambda step: resumed(step + 60))
    found += second.close()
    assert [(f.kind, f.step, f.evidence["period"]) for f in found] == [("step_stalls", 100, 25)]
    steps = found[0].evidence["steps"]
    assert {25, 50, 75, 100} <= set(steps) and 61 not in steps  # a busy machine may add a stall of its own


def warm_up_then(stall):
    """``stall``, and the slow second step of a process that resumed at step 60 (its first steps warm up
    again, as at the start of the run: they are judged by no rule)."""

    def resumed(step):
        stall(step)
        if step == 61:
            time.sleep(0.3)

    return resumed


def test_close_removes_the_hooks_and_the_collectors_callback():
    model = cnn()
    callbacks = len(gc.callbacks)
    recorder = TimingRecorder()
    recorder.attach(model)
    assert len(gc.callbacks) == callbacks + 1
    assert model._forward_pre_hooks and model._forward_hooks
    recorder.close()
    assert len(gc.callbacks) == callbacks
    assert not model._forward_pre_hooks and not model._forward_hooks


def test_bad_settings_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="memory_every=0; use warmup >= 0 and memory_every >= 1"):
        TimingRecorder(memory_every=0)


@pytest.mark.cuda
def test_on_cuda_events_time_the_steps_and_are_reused():
    model = cnn().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    feed = Feed(model, opt, warmup=0)
    x, y = torch.randn(32, 1, 16, 16, device="cuda"), torch.randint(0, 10, (32,), device="cuda")
    for _ in range(200):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        feed.log(loss)
        loss.backward()
        opt.step()
    feed.close()
    steps, rows = feed.recorder.recent.view()
    assert steps.tolist() == list(range(200))
    assert (rows[:, COLUMNS.index("forward")] > 0).all() and (rows[:, COLUMNS.index("backward")] > 0).all()
    assert feed.recorder._clock.pool.made < 100  # read every 10 steps: the pool holds a few steps' events
    _, memory = feed.recorder.memory_recent.view()
    assert memory[-1, 0] == torch.cuda.memory_allocated()


class TimingFeed(Callback):
    """The Learner's events to a TimingRecorder, in the order the Doctor callback feeds its engine."""

    def __init__(self, recorder, loader):
        self.recorder, self.loader = recorder, loader

    def before_fit(self):
        self.recorder.attach(self.learn.model, loader=self.loader)

    def before_batch(self):
        self.recorder.begin_batch(self.learn.training_step, self.learn.training)

    def after_loss(self):
        self.recorder.log_loss(self.learn.loss, self.learn.training)

    def before_step(self):
        self.recorder.gradients_ready()

    def after_step(self):
        self.recorder.step_done()

    def before_validate(self):
        self.recorder.begin_valid()

    def after_validate(self):
        self.recorder.end_valid(self.learn.training_step)

    def after_batch(self):
        if self.learn.training:
            self.recorder.end_batch()

    def after_fit(self):
        self.recorder.close()


def test_in_the_learner_the_loader_is_data_and_validation_belongs_to_no_step():
    train_dl = DataLoader(SlowImages(delay=0.01 / 32, n=256), batch_size=32)  # ~10 ms per batch
    valid_dl = DataLoader(SlowImages(delay=0.02 / 32, n=64), batch_size=32)  # ~20 ms per batch
    recorder = TimingRecorder(warmup=0)
    learn = Learner(cnn(), (train_dl, valid_dl), nn.CrossEntropyLoss(), cbs=[TimingFeed(recorder, train_dl)])
    learn.fit(2)
    steps, rows = recorder.recent.view()
    assert steps.tolist() == list(range(16))
    data, valid = rows[:, COLUMNS.index("data")], rows[:, COLUMNS.index("valid")]
    assert (data[1:] >= 0.01).all() and (data[1:] < 0.05).all()  # step 0's forward begins at begin_batch
    # the first validation is timed in the row of the step after it; the last one has no step after it
    assert valid[8] >= 0.04 and valid[[i for i in range(16) if i != 8]].sum() == 0
    assert {f.kind for f in recorder.findings()} <= {"input_bound"}
