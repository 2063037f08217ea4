"""repeated_batch and unshuffled_data on plain loops, and their healthy twins: a loader iterated
normally, `next(iter(...))` of a shuffling loader, one batch per epoch by design; shuffled data with
10 or 2 classes, small batches, regression targets."""

import torch
from protocol_loops import Feed, cnn, digits, train
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from hookscope.doctor.protocol import batches, loader_not_shuffled


def _kinds(found):
    return {f.kind: f for f in found}


def _next_iter_loop(loader, steps=8, **options):
    model = cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    feed = Feed(model, opt, **options)
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(steps):
        x, y = next(iter(loader))  # a new pass every step
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        feed.log(loss, y)
        loss.backward()
        opt.step()
    return feed.close()


def test_next_iter_of_an_unshuffled_loader_is_named():
    finding = _kinds(_next_iter_loop(digits(shuffle=False)))["repeated_batch"]
    assert finding.step == 0
    assert finding.evidence["steps"] == 5  # the steps the first check (after step 5) saw
    assert "next(iter(loader))" in finding.message and "for x, y in loader" in finding.message


def test_batches_that_change_are_silent():
    assert "repeated_batch" not in _kinds(_next_iter_loop(digits(shuffle=True)))
    model = cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    feed = Feed(model, opt)
    train(model, opt, feed, digits(shuffle=False), steps=30)  # in order, but every batch a new one
    assert feed.close() == []


def test_channels_last_inputs_are_fingerprinted_without_a_copy():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 10))
    model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    feed = Feed(model, opt)
    x, y = next(iter(digits(shuffle=False)))
    x = x.repeat(1, 3, 1, 1).contiguous(memory_format=torch.channels_last)  # RGB-shaped
    assert not x.is_contiguous()
    for _ in range(4):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x.clone()), y).backward()  # a clone keeps channels_last
        opt.step()
    assert _kinds(feed.close())["repeated_batch"].evidence["steps"] == 4
    flat = batches._flat_view(x)  # what is sampled: the batch's own memory, not a copy of it
    assert flat.data_ptr() == x.data_ptr() and flat.numel() == x.numel()
    assert batches._flat_view(x[:, :, :4]) is None  # a view with gaps is skipped, not copied


def test_one_batch_per_epoch_by_design_is_silent():
    loader = digits(n=64)
    assert len(loader) == 1
    found = _next_iter_loop(loader, batches_per_epoch=1)
    assert "repeated_batch" not in _kinds(found)


def test_the_same_tensor_at_every_step_is_one_batch_on_purpose():
    """pytorch.org's "Learning PyTorch with Examples": a polynomial fitted to 2,000 fixed points, the same
    tensor given to the model at every step (full-batch training). A loader that starts a new pass at
    every step makes a new tensor of the same values each time: that one is named."""
    torch.manual_seed(0)
    x = torch.linspace(-3.14, 3.14, 2000)
    xx, y = x.unsqueeze(-1).pow(torch.tensor([1, 2, 3])), torch.sin(x)
    for fresh, named in ((False, False), (True, True)):
        model = nn.Sequential(nn.Linear(3, 1), nn.Flatten(0, 1))
        opt = torch.optim.RMSprop(model.parameters(), lr=1e-3)
        feed = Feed(model, opt)
        for _ in range(12):
            loss = nn.functional.mse_loss(model(xx.clone() if fresh else xx), y, reduction="sum")
            opt.zero_grad()
            loss.backward()
            opt.step()
        assert ("repeated_batch" in _kinds(feed.close())) is named


def _episodes(model, opt, feed, steps, states, accumulate=False):
    """One optimizer step per sequence of ``states(step)`` inputs, each a forward with autograd: a
    policy rolled out over an episode (REINFORCE), or micro-batches accumulated into one step."""
    for step in range(steps):
        opt.zero_grad()
        for x in states(step):
            out = model(x)
            (
                out.sum() if not accumulate else nn.functional.cross_entropy(out, torch.zeros(len(x)).long())
            ).backward()
        opt.step()
    return _kinds(feed.close())


def test_a_step_over_a_sequence_of_inputs_is_no_repeated_batch():
    """REINFORCE (pytorch/examples reinforcement_learning): every episode starts from the same state, so
    each step's first forward sees the same values, then the states the episode visits. Gradient
    accumulation with `next(iter(loader))` runs the same batch in every forward of the step: named."""
    torch.manual_seed(0)
    start = torch.zeros(1, 8)
    start[0, 0] = 1.0

    def episode(step):  # a new tensor of the start state, again where a move left hit the wall, then on
        again = [start.clone()] * (step % 2)
        return [start.clone(), *again, *torch.rand(3 + step % 4, 1, 8).unbind(0)]

    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    assert "repeated_batch" not in _episodes(model, opt, Feed(model, opt), 12, episode)
    walk = torch.rand(6, 1, 8)  # a converged policy in a deterministic world: every episode the same walk
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    same_walk = _episodes(model, opt, Feed(model, opt), 12, lambda step: [start.clone(), *walk.clone()])
    assert "repeated_batch" not in same_walk

    batch = torch.rand(16, 8)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    found = _episodes(model, opt, Feed(model, opt), 12, lambda step: [batch.clone() for _ in range(4)], True)
    assert found["repeated_batch"].evidence["steps"] == 5  # steps 0-4, at the first check


def test_integer_inputs_are_fingerprinted():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(50, 8), nn.Flatten(), nn.Linear(8 * 12, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    feed = Feed(model, opt)
    tokens, labels = torch.randint(0, 50, (4, 12)), torch.tensor([0, 1, 0, 1])
    for step in range(6):
        opt.zero_grad()
        x = tokens.clone() if step >= 2 else torch.randint(0, 50, (4, 12))
        nn.functional.cross_entropy(model(x), labels).backward()
        opt.step()
    finding = _kinds(feed.close())["repeated_batch"]
    assert (finding.step, finding.evidence["steps"]) == (2, 3)  # steps 2-4, at the check after step 5


def _label_loop(loader, steps=40, loss_fn=None, target=None):
    model = cnn()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    feed = Feed(model, opt)
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    done = 0
    while done < steps:
        for x, y in loader:
            y = target(y) if target is not None else y
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            feed.log(loss, y)
            loss.backward()
            opt.step()
            done += 1
            if done == steps:
                break
    return feed.close()


def test_label_sorted_data_is_named():
    finding = _kinds(_label_loop(digits(shuffle=False, sort=True)))["unshuffled_data"]
    assert finding.step == 9  # the last batch of the first check with enough batches (8)
    assert finding.evidence["distance"] > 3 * finding.evidence["random_distance"]
    assert "shuffle=True" in finding.message


def test_shuffled_labels_are_silent_with_many_or_two_classes_and_small_batches():
    assert _label_loop(digits(shuffle=True)) == []
    assert _label_loop(digits(shuffle=True, batch_size=4), steps=60) == []
    x, y = next(iter(digits(shuffle=False, batch_size=2000)))
    two = y < 2
    loader = DataLoader(TensorDataset(x[two], y[two]), batch_size=8, shuffle=True)
    assert _label_loop(loader, steps=40) == []


def test_regression_targets_are_skipped():
    sorted_loader = digits(shuffle=False, sort=True)

    def as_float(y):
        return nn.functional.one_hot(y, 10).float()  # soft targets: floats, not class indices

    assert _label_loop(sorted_loader, loss_fn=nn.MSELoss(), target=as_float) == []


def test_loader_not_shuffled():
    [finding] = loader_not_shuffled(digits(shuffle=False))
    assert (finding.kind, finding.evidence["sampler"]) == ("unshuffled_data", "SequentialSampler")
    assert finding.severity == "info"  # a property of the loader; the label mix is the evidence
    assert "shuffle=True" in finding.message
    assert loader_not_shuffled(digits(shuffle=True)) == []

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(4))

    assert loader_not_shuffled(DataLoader(Stream(), batch_size=2)) == []


class Tagger(nn.Module):
    """A transformers-style model: keyword inputs (``model(input_ids=...)``)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 8)
        self.head = nn.Linear(8, 2)

    def forward(self, input_ids):
        return self.head(self.embed(input_ids).mean(1))


def test_keyword_inputs_are_fingerprinted():
    torch.manual_seed(0)
    model = Tagger()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    feed = Feed(model, opt)
    batch = {"input_ids": torch.randint(0, 50, (4, 12))}
    for _ in range(5):
        opt.zero_grad()
        inputs = {name: t.clone() for name, t in batch.items()}  # collated anew, as a loader does
        nn.functional.cross_entropy(model(**inputs), torch.tensor([0, 1, 0, 1])).backward()
        opt.step()
    assert _kinds(feed.close())["repeated_batch"].evidence["steps"] == 5
