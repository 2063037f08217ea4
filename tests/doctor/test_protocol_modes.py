"""train_in_eval_mode / eval_in_train_mode on plain loops with validation passes, and their healthy
twins: validation that switches modes correctly, a frozen backbone in eval, BatchNorm kept in eval on
purpose, a GAN's one no-grad generator forward per step."""

import torch
from protocol_loops import Feed, cnn, digits, valid_digits
from test_protocol_gradients import dcgan
from torch import nn


def _fit(model, feed, opt, epochs=2, steps_per_epoch=6, evaluate=None):
    """Train a few steps per epoch, then run ``evaluate(model)`` (a validation pass) after each epoch."""
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(epochs):
        for i, (x, y) in enumerate(digits()):
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            feed.log(loss, y)
            loss.backward()
            opt.step()
            if i + 1 == steps_per_epoch:
                break
        if evaluate is not None:
            evaluate(model)
    return feed.close()


def _validate(switch_back: bool, no_grad: bool = True, eval_mode: bool = True):
    def evaluate(model):
        if eval_mode:
            model.eval()
        with torch.no_grad() if no_grad else torch.enable_grad():
            for x, _ in valid_digits():
                model(x)
        if switch_back:
            model.train()

    return evaluate


def _kinds(found):
    return {f.kind: f for f in found}


def test_training_after_validation_without_train_is_named():
    model = cnn()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    found = _kinds(_fit(model, Feed(model, opt), opt, evaluate=_validate(switch_back=False)))
    finding = found["train_in_eval_mode"]
    assert finding.step == 6  # the first step after the validation pass
    assert finding.module == ""  # the whole model was in eval mode
    assert set(finding.evidence["modules"]) == {"1", "4"}
    assert "model.train()" in finding.message
    assert "eval_in_train_mode" not in found


def test_validation_that_switches_modes_is_silent():
    model = cnn()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    assert _fit(model, Feed(model, opt), opt, evaluate=_validate(switch_back=True)) == []


def test_evaluation_in_train_mode_is_named():
    model = cnn()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    found = _kinds(_fit(model, Feed(model, opt), opt, evaluate=_validate(False, eval_mode=False)))
    finding = found["eval_in_train_mode"]
    assert finding.step == 6  # the step the loop counts when the first evaluation runs
    assert set(finding.evidence["modules"]) == {"1", "4"}
    assert "model.eval()" in finding.message
    assert "train_in_eval_mode" not in found


def test_a_validation_phase_the_loop_announces_counts_from_its_first_batch():
    model = cnn()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    feed = Feed(model, opt)
    x, _ = next(iter(valid_digits()))
    feed.recorder.begin_valid()
    with torch.no_grad():
        model(x)  # one batch, model left in train mode
    feed.recorder.end_valid(0)
    assert [f.kind for f in feed.close()] == ["eval_in_train_mode"]


def test_frozen_backbone_in_eval_is_silent():
    torch.manual_seed(0)
    tail = nn.Sequential(nn.ReLU(), nn.Dropout(0.1))  # no parameters: the backbone's decide
    backbone = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), tail)
    model = nn.Sequential(backbone, nn.Flatten(), nn.Linear(8 * 64, 10))
    backbone.requires_grad_(False)
    backbone.eval()  # frozen on purpose: its BatchNorm keeps its statistics
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    assert _fit(model, Feed(model, opt), opt, evaluate=None) == []


def test_a_backbone_unfrozen_but_left_in_eval_is_named():
    torch.manual_seed(0)
    backbone = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout(0.1))
    model = nn.Sequential(backbone, nn.Flatten(), nn.Linear(8 * 64, 10))
    backbone.requires_grad_(False)
    backbone.eval()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)  # the backbone's parameters get no gradient yet
    feed = Feed(model, opt)
    for step, (x, y) in enumerate(digits()):
        if step == 7:
            backbone.requires_grad_(True)  # unfrozen, but its dropout still in eval mode
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if step == 12:
            break
    finding = _kinds(feed.close())["train_in_eval_mode"]
    assert finding.module == "0.1"
    assert finding.step == 10  # the first step after the check (at 10) that forgot the frozen verdict


def test_batchnorm_kept_in_eval_while_the_model_trains_is_silent():
    model = cnn()
    model[1].eval()  # small-batch fine-tuning keeps BatchNorm statistics, its affine still trains
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    assert _fit(model, Feed(model, opt), opt) == []


def test_dropout_left_in_eval_while_the_model_trains_is_named():
    model = cnn()
    model[4].eval()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    finding = _kinds(_fit(model, Feed(model, opt), opt))["train_in_eval_mode"]
    assert finding.module == "4"
    assert finding.step == 0


def test_a_gan_generator_forward_under_no_grad_is_silent():
    assert dcgan("G") == []
