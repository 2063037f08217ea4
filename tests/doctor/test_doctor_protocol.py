"""The Learner's Doctor feeds the loop-protocol checks what only it knows: the run's length, the scheduler
callbacks (named in lr_schedule), the targets, whether the training loader shuffles, and, when asked, the
overlap of validation and training data — once, on a fresh fit."""

import torch
from faults import digits_flat, digits_sorted, mlp, step_lr_per_batch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hookscope as hs


def _fit(dls, epochs=1, cbs=(), **doctor_kw):
    torch.manual_seed(0)
    doctor = hs.callbacks.Doctor(quiet=True, check_every=3, **doctor_kw)
    learn = hs.Learner(mlp(depth=3), dls, nn.CrossEntropyLoss(), lr=1e-2, cbs=[doctor, *cbs], progress=False)
    learn.fit(epochs)
    return learn


def test_a_per_epoch_scheduler_stepped_per_batch_is_named_and_explains_the_update_ratios():
    scheduler = hs.callbacks.LRScheduler(step_lr_per_batch, interval="step")
    learn = _fit(digits_flat(), cbs=[scheduler])
    [cause] = [f for f in learn.doctor.findings if f.kind == "lr_schedule"]
    assert cause.step == 2 and "StepLR" in cause.message and cause.evidence["scheduler"] == "StepLR"
    assert "(23 steps)" in cause.message  # the run's length, from the Learner
    ratios = [f for f in learn.doctor.findings if f.kind == "update_ratio"]
    assert ratios and {f.key for f in ratios} <= set(cause.explains)


def test_one_cycle_is_named_as_the_scheduler_and_is_silent():
    learn = _fit(digits_flat(), epochs=2, cbs=[hs.callbacks.OneCycle(1e-2)])
    assert [f for f in learn.doctor.findings if f.kind == "lr_schedule"] == []
    assert learn.doctor.engine.protocol.lr.schedulers == ["OneCycle"]


def test_sorted_labels_in_a_loader_that_reads_in_order_are_named_twice_a_hint_then_the_evidence():
    learn = _fit(digits_sorted())
    hint, evidence = [f for f in learn.doctor.findings if f.kind == "unshuffled_data"]
    assert (hint.severity, hint.step, hint.evidence["sampler"]) == ("info", 0, "SequentialSampler")
    # the first check with 8 batches' labels: every 3 steps and at the warm-up's end (steps 2, 4, 7)
    assert evidence.severity == "warning" and evidence.step == 7


def test_overlap_is_checked_at_the_first_fresh_fit_when_asked():
    x, y, _, _ = hs.data.digits.digits_tensors()
    x = x.flatten(1)
    gen = torch.Generator().manual_seed(0)
    train = DataLoader(TensorDataset(x[:512], y[:512]), batch_size=64, shuffle=True, generator=gen)
    valid = DataLoader(TensorDataset(x[256:640], y[256:640]), batch_size=128)  # half are training samples
    learn = _fit((train, valid), overlap=True)
    [overlap] = [f for f in learn.doctor.findings if f.kind == "train_valid_overlap"]
    assert overlap.severity == "warning"
    learn.fit(1)  # a second fit of the same Learner checks nothing again
    assert [f.kind for f in learn.doctor.findings].count("train_valid_overlap") == 1
    assert [f for f in _fit((train, valid)).doctor.findings if f.kind == "train_valid_overlap"] == []
