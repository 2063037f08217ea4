"""The steps the protocol's device checks watch: every step of the start, a short look every PERIOD
steps and after a batch that does not train; a fault that begins on an unwatched step is named at the
next look, and unwatched steps put nothing on the device."""

import numpy as np
import torch
from protocol_loops import Feed, cnn, digits
from torch import nn

from hookscope.doctor.protocol import looks
from hookscope.doctor.protocol.batches import RepeatedBatch


def _watched(looks_, steps, pause_at=None):
    watched = []
    for step in steps:
        if step == pause_at:
            looks_.begin_batch(step, training=False)  # a validation batch before this step
        looks_.begin_batch(step, training=True)
        if looks_.watching:
            watched.append(step)
    return watched


def test_the_start_is_watched_then_a_look_every_period_and_after_a_pause():
    assert (looks.DENSE, looks.WINDOW, looks.PERIOD) == (32, 4, 32)
    watched = _watched(looks.Looks(), range(131), pause_at=70)
    expected = [*range(36), *range(64, 68), *range(70, 74), *range(96, 100), *range(128, 131)]
    assert watched == expected


def test_a_resumed_or_reattached_run_is_watched_from_its_first_step():
    resumed = looks.Looks()
    assert _watched(resumed, range(200, 210)) == [200, 201, 202, 203]  # 200 % 32 == 8: not a look


def _loop(steps, repeat_from):
    """A shuffling loader iterated normally, then `next(iter(in_order))` of an unshuffled one every step
    from `repeat_from`."""
    model = cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    feed = Feed(model, opt, check_every=10)
    loader, in_order, loss_fn = digits(shuffle=True), digits(shuffle=False), nn.CrossEntropyLoss()
    batches = iter(loader)
    for step in range(steps):
        if step >= repeat_from:
            x, y = next(iter(in_order))
        else:
            x, y = next(batches, None) or next(batches := iter(loader))
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        feed.log(loss, y)
        loss.backward()
        opt.step()
    return feed


def test_a_repeated_batch_that_begins_on_an_unwatched_step_is_named_at_the_next_look():
    feed = _loop(80, repeat_from=40)
    found = {f.kind: f for f in feed.close()}
    assert found["repeated_batch"].step == 64  # the look of steps 64-67
    assert found["repeated_batch"].evidence["steps"] == 4


def test_unwatched_steps_put_nothing_on_the_device():
    feed = _loop(80, repeat_from=80)
    recorder = feed.recorder
    watched = 32 + 4 + 4  # steps 0-31, 32-35, 64-67
    assert recorder.repeats.ring._written == watched  # one fingerprint per watched step
    assert recorder.labels.ring._written == watched  # one label copy per watched step
    assert "repeated_batch" not in {f.kind for f in feed.close()}


def test_equal_inputs_of_steps_apart_are_no_run():
    check = RepeatedBatch()
    x = torch.arange(64.0).reshape(4, 16)

    def fingerprint(step):
        check.begin_batch(step, training=True)
        check.forward(x.clone())  # a new tensor of the same values, as a loader makes
        check.step_done()

    for step in (30, 31, 64, 65):  # two looks apart: two runs of two
        fingerprint(step)
    check.read(np.asarray(check.ring.pending()))
    assert check.found is None
    fingerprint(66)
    check.read(np.asarray(check.ring.pending()))
    assert check.found == (64, 3)


def _textbook(steps, before_step=lambda step, model, opt: None):
    """Shuffled digits, SGD, zero_grad every step; ``before_step`` runs first in each step (it may change
    the loop: stop zeroing, switch the model's mode). Returns the feed, and per step whether a parameter
    carried the protocol's hook during its backward and how often the modes were read."""
    model = cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    feed = Feed(model, opt, check_every=10)
    reads = []
    forward = feed.recorder.modes.forward
    feed.recorder.modes.forward = lambda root: (reads.append(feed.step), forward(root))
    loader, loss_fn = digits(shuffle=True), nn.CrossEntropyLoss()
    batches, hooked = iter(loader), {}
    for step in range(steps):
        zero = before_step(step, model, opt) is not False
        x, y = next(batches, None) or next(batches := iter(loader))
        if zero:
            opt.zero_grad()
        loss = loss_fn(model(x), y)
        feed.log(loss, y)
        loss.backward()
        hooked[step] = any(getattr(p, "_post_accumulate_grad_hooks", None) for p in model.parameters())
        opt.step()
    return feed, hooked, reads


def test_a_missing_zero_grad_that_begins_between_looks_is_named_at_the_next_look():
    feed, hooked, _ = _textbook(80, lambda step, model, opt: step < 40)
    found = {f.kind: f for f in feed.close()}
    assert found["stale_gradients"].step == 65  # the look of 64-67: its first step has nothing to compare
    watched = {*range(36), *range(64, 68)}
    assert [s for s in hooked if hooked[s]] == sorted(watched)  # no hook between the looks


def test_model_eval_without_a_validation_pass_is_named_at_the_next_step():
    def forget_train(step, model, opt):
        if step == 40:
            model.eval()  # a callback or a helper left the model in eval mode; nothing evaluates

    feed, _, _ = _textbook(60, forget_train)
    found = {f.kind: f for f in feed.close()}
    assert found["train_in_eval_mode"].step == 41  # the mode's change starts a look
    healthy, _, healthy_reads = _textbook(80)
    assert "train_in_eval_mode" not in {f.kind for f in healthy.close()}
    assert sorted(set(healthy_reads)) == [*range(36), *range(64, 68)]  # the modes are read in looks only
