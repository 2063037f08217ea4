"""The ProtocolRecorder as a whole: a resumed run finds what an uninterrupted one finds, from a state that
a checkpoint loads safely; closing removes its hooks."""

import io

import torch
from protocol_loops import Feed, cnn, digits
from torch import nn


class Faulty:
    """A loop with several mistakes, resumable at any step: label-sorted data, the same batch for steps
    8-14 (`next(iter(loader))`), an ExponentialLR built for epochs stepped per batch."""

    def __init__(self):
        self.model = cnn()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.scheduler = torch.optim.lr_scheduler.ExponentialLR(self.opt, gamma=0.8)
        self.batches = list(digits(shuffle=False, sort=True))

    def feed(self, **options):
        return Feed(self.model, self.opt, total_steps=400, schedulers=[self.scheduler], **options)

    def run(self, feed, start, stop):
        for step in range(start, stop):
            x, y = self.batches[8 if 8 <= step <= 14 else step % len(self.batches)]
            x, y = x.clone(), y.clone()  # a loader collates new tensors at every step
            self.opt.zero_grad()
            loss = nn.functional.cross_entropy(self.model(x), y)
            feed.log(loss, y)
            loss.backward()
            self.opt.step()
            self.scheduler.step()


def _as_dicts(found):
    return sorted((f.to_dict() for f in found), key=lambda d: (d["kind"], d["step"]))


def test_a_resumed_run_finds_what_an_uninterrupted_one_finds():
    whole = Faulty()
    feed = whole.feed()
    whole.run(feed, 0, 40)
    expected = _as_dicts(feed.close())
    assert {d["kind"] for d in expected} == {"repeated_batch", "unshuffled_data", "lr_schedule"}

    first = Faulty()
    feed = first.feed()
    first.run(feed, 0, 12)  # a checkpoint inside the repeated run, between two checks
    buffer = io.BytesIO()
    torch.save(feed.recorder.state_dict(), buffer)
    found = feed.abandon()
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)  # what a checkpoint loads
    feed = first.feed(start=12, state=state)  # the same model and optimizer go on
    first.run(feed, 12, 40)
    assert _as_dicts(found + feed.close()) == expected


def test_close_removes_every_hook():
    model = cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    feed = Feed(model, opt)
    assert feed.close() == []
    for x, y in digits(shuffle=False):  # no zero_grad, the same batch every step, the model in eval
        model.eval()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if feed.step == 6:
            break
    assert feed.recorder.findings() == []
