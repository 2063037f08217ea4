"""graph_kept_alive: `total += loss` and a list of outputs that require grad keep every step's graph;
`loss.item()` and `.detach()` do not."""

import torch
from protocol_loops import Feed, cnn, digits
from torch import nn


def _loop(keep, steps=25):
    model = cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    feed = Feed(model, opt)
    loss_fn = nn.CrossEntropyLoss()
    total, outputs = 0.0, []
    for i, (x, y) in enumerate(digits()):
        opt.zero_grad()
        out = model(x)
        loss = loss_fn(out, y)
        feed.log(loss)
        loss.backward()
        opt.step()
        total, outputs = keep(total, outputs, loss, out)
        if i + 1 == steps:
            break
    return {f.kind: f for f in feed.close()}


def test_summing_losses_with_their_graphs_is_named():
    finding = _loop(lambda total, outputs, loss, out: (total + loss, outputs))["graph_kept_alive"]
    # every step before the one just done (steps 0-8), at the first check that saw the count grow
    assert finding.evidence["steps_kept"] == 9
    assert finding.step == 0
    assert "loss.item()" in finding.message
    assert "not measured" in finding.message  # on CPU


def test_keeping_outputs_that_require_grad_is_named():
    found = _loop(lambda total, outputs, loss, out: (total, [*outputs, out]))
    assert "graph_kept_alive" in found


def test_a_validation_loop_without_no_grad_that_sums_its_losses_is_named():
    model = cnn()
    model.eval()  # but no torch.no_grad(): every forward builds a graph, kept by the sum
    feed = Feed(model, torch.optim.SGD(model.parameters(), lr=0.05))
    total = 0.0
    for i, (x, y) in enumerate(digits(batch_size=16)):
        total = total + nn.functional.cross_entropy(model(x), y)
        if i % 10 == 9:  # the loop's checks fall inside the validation pass
            feed.found += feed.recorder.findings()
        if i == 30:
            break
    finding = {f.kind: f for f in feed.close()}["graph_kept_alive"]
    assert finding.evidence["steps_kept"] == 1
    assert finding.evidence["forwards_kept"] == 20  # at the second check
    assert "torch.no_grad()" in finding.message


def test_numbers_and_detached_tensors_are_silent():
    assert _loop(lambda total, outputs, loss, out: (total + loss.item(), outputs)) == {}
    assert _loop(lambda total, outputs, loss, out: (total + loss.detach(), [*outputs, out.detach()])) == {}


def test_the_forwards_of_the_step_just_done_are_silent_however_many():
    """REINFORCE (pytorch/examples reinforcement_learning/reinforce.py): one forward per move of an
    episode, their log-probabilities kept in a list until the episode's step, the list replaced at the
    next episode. Episodes of 9 to 40 moves held 9 to 40 graphs at each check, more at one check than at
    the one before half the time: named at step 224 of a 300-episode run."""
    torch.manual_seed(0)
    policy = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2), nn.Softmax(dim=1))
    opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
    feed = Feed(policy, opt)
    for episode in range(40):
        log_probs = []
        for _ in range(9 + (episode * 7) % 32):  # episode lengths that rise and fall from check to check
            probs = policy(torch.rand(1, 8))
            action = torch.distributions.Categorical(probs).sample()
            log_probs.append(torch.distributions.Categorical(probs).log_prob(action))
        opt.zero_grad()
        torch.cat(log_probs).sum().neg().backward()
        opt.step()
    assert feed.close() == []
