import copy
import functools
import io

import pytest
import torch
from rich.console import Console
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hookscope as hs
from hookscope.hooks.handles import HookSet
from hookscope.train.callback import CallbackOrderError
from hookscope.train.events import (
    EVENTS,
    CancelBackwardException,
    CancelBatchException,
    CancelEpochException,
    CancelFitException,
    CancelStepException,
    CancelTrainException,
    CancelValidException,
)


def _record(event):
    def method(self, *args):
        self.seen.append(event)

    return method


class EventLog(hs.Callback):
    """Records every event it receives, in order."""

    def __init__(self):
        self.seen = []

    after_create = _record("after_create")
    before_fit = _record("before_fit")
    before_epoch = _record("before_epoch")
    before_train = _record("before_train")
    before_batch = _record("before_batch")
    after_pred = _record("after_pred")
    after_loss = _record("after_loss")
    before_backward = _record("before_backward")
    after_backward = _record("after_backward")
    before_step = _record("before_step")
    after_step = _record("after_step")
    after_batch = _record("after_batch")
    after_train = _record("after_train")
    before_validate = _record("before_validate")
    after_validate = _record("after_validate")
    after_epoch = _record("after_epoch")
    after_fit = _record("after_fit")
    after_cancel_fit = _record("after_cancel_fit")
    after_cancel_epoch = _record("after_cancel_epoch")
    after_cancel_train = _record("after_cancel_train")
    after_cancel_validate = _record("after_cancel_validate")
    after_cancel_batch = _record("after_cancel_batch")
    after_cancel_backward = _record("after_cancel_backward")
    after_cancel_step = _record("after_cancel_step")
    on_failure = _record("on_failure")


class RaiseAt(hs.Callback):
    """Raises ``exc`` at the first occurrence of ``event``."""

    def __init__(self, event, exc):
        self.event, self.exc, self.raised = event, exc, False
        setattr(self, event, self._maybe_raise)

    def _maybe_raise(self):
        if not self.raised:
            self.raised = True
            raise self.exc


def _data(n_train=8, n_valid=4, batch_size=4, shuffle=False):
    g = torch.Generator().manual_seed(0)
    x, y = (
        torch.randn(n_train + n_valid, 3, generator=g),
        torch.randint(0, 2, (n_train + n_valid,), generator=g),
    )
    train = DataLoader(TensorDataset(x[:n_train], y[:n_train]), batch_size=batch_size, shuffle=shuffle)
    valid = DataLoader(TensorDataset(x[n_train:], y[n_train:]), batch_size=batch_size)
    return train, valid


def _learner(cbs=(), **kwargs):
    torch.manual_seed(0)
    return hs.Learner(nn.Linear(3, 2), _data(), nn.CrossEntropyLoss(), cbs=cbs, progress=False, **kwargs)


TRAIN_BATCH = [
    "before_batch",
    "after_pred",
    "after_loss",
    "before_backward",
    "after_backward",
    "before_step",
    "after_step",
    "after_batch",
]
VALID_BATCH = ["before_batch", "after_pred", "after_loss", "after_batch"]
EPOCH = [
    "before_epoch",
    "before_train",
    *TRAIN_BATCH * 2,
    "after_train",
    "before_validate",
    *VALID_BATCH,
    "after_validate",
    "after_epoch",
]


def test_two_epoch_fit_fires_the_documented_event_sequence():
    log = EventLog()
    learn = _learner(cbs=[log])
    learn.fit(2)
    assert log.seen == ["after_create", "before_fit", *EPOCH * 2, "after_fit"]
    assert set(log.seen) <= set(EVENTS)


VALIDATION = ["before_validate", *VALID_BATCH, "after_validate", "after_epoch", "after_fit"]
START = ["before_epoch", "before_train"]
SECOND_BATCH = [*TRAIN_BATCH, "after_train", *VALIDATION]


@pytest.mark.parametrize(
    ("event", "exc", "expected"),
    [
        (
            "before_batch",
            CancelBatchException,
            [
                *START,
                "before_batch",
                "after_cancel_batch",
                "after_batch",
                *TRAIN_BATCH,
                "after_train",
                *VALIDATION,
            ],
        ),
        (
            "before_backward",
            CancelBackwardException,
            [*START, *TRAIN_BATCH[:4], "after_cancel_backward", *TRAIN_BATCH[4:], *SECOND_BATCH],
        ),
        (
            "before_step",
            CancelStepException,
            [*START, *TRAIN_BATCH[:6], "after_cancel_step", *TRAIN_BATCH[6:], *SECOND_BATCH],
        ),
        ("before_train", CancelTrainException, [*START, "after_cancel_train", "after_train", *VALIDATION]),
        (
            "after_pred",
            CancelEpochException,
            [*START, "before_batch", "after_pred", "after_cancel_epoch", "after_epoch", "after_fit"],
        ),
        (
            "after_loss",
            CancelFitException,
            [*START, *TRAIN_BATCH[:3], "after_cancel_fit", "after_fit"],
        ),
    ],
)
def test_each_cancel_exception_fires_after_cancel_then_after(event, exc, expected):
    log = EventLog()
    learn = _learner(cbs=[log, RaiseAt(event, exc())])
    learn.fit(1)
    assert log.seen[:2] == ["after_create", "before_fit"]
    assert log.seen[2:] == expected


def test_cancel_validate_skips_the_validation_batches():
    log = EventLog()
    learn = _learner(cbs=[log, RaiseAt("before_validate", CancelValidException())])
    learn.fit(1)
    tail = log.seen[log.seen.index("before_validate") :]
    assert tail == ["before_validate", "after_cancel_validate", "after_validate", "after_epoch", "after_fit"]
    assert learn.recorder.history[0]["valid_loss"] != learn.recorder.history[0]["valid_loss"]  # nan


class SkipEveryStep(hs.Callback):
    def before_step(self):
        self.grads_before = [p.grad.clone() for p in self.learn.model.parameters()]
        raise CancelStepException()


def test_cancel_step_skips_the_step_but_still_zeroes_the_gradients():
    skip = SkipEveryStep()
    learn = _learner(cbs=[skip])
    before = copy.deepcopy(learn.model.state_dict())
    learn.fit(1)
    for name, value in learn.model.state_dict().items():
        assert torch.equal(value, before[name])
    assert all(g.abs().sum() > 0 for g in skip.grads_before)
    assert all(p.grad is None for p in learn.model.parameters())
    assert learn.training_step == 0


class CancelBatchAfterBackward(hs.Callback):
    def after_backward(self):
        raise CancelBatchException()


def test_cancel_batch_after_backward_skips_step_and_zero_grad():
    learn = _learner(cbs=[CancelBatchAfterBackward()])
    learn.fit(1)
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in learn.model.parameters())
    assert learn.training_step == 0


class FailingAssert(hs.Callback):
    def after_loss(self):
        assert self.learn.iter > 5, "deliberate"


class HookedModel(hs.Callback):
    """Registers a forward hook in before_fit and removes it in after_fit / on_failure, as monitors do."""

    def before_fit(self):
        self.hooks = HookSet()
        self.hooks.forward(self.learn.model, lambda m, i, o: None)

    def after_fit(self):
        self.hooks.remove()

    def on_failure(self, exc):
        self.failure = exc
        self.hooks.remove()


def test_failing_callback_keeps_its_exception_and_tears_everything_down():
    log, hooked = EventLog(), HookedModel()
    bar = hs.callbacks.ProgressBar(console=Console(file=io.StringIO()))
    learn = _learner(cbs=[log, bar])
    with pytest.raises(AssertionError, match="deliberate"):
        learn.fit(1, cbs=[FailingAssert(), hooked])
    assert log.seen[-1] == "on_failure"
    assert "after_fit" not in log.seen
    assert isinstance(hooked.failure, AssertionError)
    assert not learn.model._forward_hooks
    assert not bar.is_open
    assert all(not isinstance(cb, FailingAssert | HookedModel) for cb in learn.cbs)
    assert not hasattr(learn, "failing_assert")
    assert not learn.training


def test_keyboard_interrupt_fires_on_failure_and_propagates_unchanged():
    log = EventLog()
    learn = _learner(cbs=[log, RaiseAt("after_step", KeyboardInterrupt())])
    with pytest.raises(KeyboardInterrupt):
        learn.fit(1)
    assert log.seen[-1] == "on_failure"


def test_a_failing_failure_handler_does_not_mask_the_original_exception():
    class BadHandler(hs.Callback):
        def on_failure(self, exc):
            raise RuntimeError("handler bug")

    learn = _learner(cbs=[BadHandler(), RaiseAt("before_batch", ValueError("original"))])
    with pytest.warns(UserWarning, match="handler bug"), pytest.raises(ValueError, match="original"):
        learn.fit(1)


def test_callbacks_are_reachable_by_name_and_names_must_be_unique():
    log = EventLog()
    learn = _learner(cbs=[log])
    assert learn.event_log is log and learn.recorder in learn.cbs
    with pytest.raises(ValueError, match="event_log"):
        learn.add_cb(EventLog())
    learn.remove_cb(log)
    assert not hasattr(learn, "event_log")


def test_run_before_and_run_after_decide_the_order_within_an_event():
    order = []

    class First(hs.Callback):
        run_before = ("Second",)

        def before_fit(self):
            order.append("first")

    class Second(hs.Callback):
        order = -100

        def before_fit(self):
            order.append("second")

    _learner(cbs=[Second(), First()]).fit(1)
    assert order == ["first", "second"]


def test_a_cycle_is_an_error_naming_the_callbacks():
    class A(hs.Callback):
        run_after = ("B",)

    class B(hs.Callback):
        run_after = (A,)

    with pytest.raises(CallbackOrderError, match=r"A, B|B, A"):
        _learner(cbs=[A(), B()])
    learn = _learner()
    with pytest.raises(CallbackOrderError, match=r"A, B|B, A"):
        learn.fit(1, cbs=[A(), B()])
    assert [type(cb) for cb in learn.cbs] == [hs.callbacks.Recorder]


def _hand_written(model, batches, lr):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for x, y in batches:
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    return model


@pytest.mark.parametrize("in_memory", [True, False])
def test_same_final_weights_as_a_hand_written_loop(in_memory):
    x, y = torch.randn(100, 3), torch.randint(0, 2, (100,))
    train = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, generator=torch.Generator())
    torch.manual_seed(1)
    reference = nn.Linear(3, 2)
    model = copy.deepcopy(reference)
    train.generator.manual_seed(7)
    torch.manual_seed(3)
    expected = _hand_written(reference, [b for _ in range(2) for b in train], lr=0.1)
    train.generator.manual_seed(7)
    torch.manual_seed(3)
    dls = hs.DataLoaders(train, in_memory=in_memory)
    learn = hs.Learner(model, dls, nn.CrossEntropyLoss(), opt_func=torch.optim.SGD, lr=0.1, progress=False)
    learn.fit(2)
    assert learn.training_step == 14
    for got, want in zip(learn.model.parameters(), expected.parameters(), strict=True):
        torch.testing.assert_close(got, want)


def test_history_rows_hold_losses_metrics_and_time():
    learn = _learner(metrics=[hs.metrics.accuracy])
    learn.fit(2)
    history = learn.recorder.history
    assert [row["epoch"] for row in history] == [0, 1]
    assert set(history[0]) == {"epoch", "train_loss", "valid_loss", "accuracy", "time"}
    preds, targets = learn.get_preds()
    expected_loss = nn.functional.cross_entropy(preds, targets).item()
    assert history[-1]["valid_loss"] == pytest.approx(expected_loss, rel=1e-5)
    assert history[-1]["accuracy"] == pytest.approx((preds.argmax(1) == targets).float().mean().item())
    assert learn.validate() == pytest.approx(
        {"valid_loss": expected_loss, "accuracy": history[-1]["accuracy"]}
    )


def test_validate_without_the_recorder_measures_with_one_for_that_call_only():
    learn = _learner(metrics=[hs.metrics.accuracy])
    learn.fit(1)
    expected = learn.validate()
    learn.remove_cb(learn.recorder)

    assert learn.validate() == pytest.approx(expected)
    assert not hasattr(learn, "recorder")
    assert not any(isinstance(cb, hs.callbacks.Recorder) for cb in learn.cbs)


def test_validate_reads_the_learners_own_recorder_when_it_has_one():
    class CountingRecorder(hs.callbacks.Recorder):
        validations = 0

        def after_validate(self):
            super().after_validate()
            self.validations += 1

    recorder = CountingRecorder()
    learn = _learner(cbs=[recorder])
    learn.validate()
    assert recorder.validations == 1
    assert [type(cb) for cb in learn.cbs] == [CountingRecorder]


def test_fit_lr_sets_the_optimizer_learning_rate():
    learn = _learner()
    learn.fit(1, lr=0.05)
    assert learn.opt.param_groups[0]["lr"] == 0.05
    assert learn.recorder.lrs == [0.05, 0.05]


def test_predict_and_get_preds_restore_the_training_mode():
    learn = _learner()
    learn.model.train()
    out = learn.predict(torch.zeros(5, 3))
    assert out.shape == (5, 2) and not out.requires_grad
    assert learn.model.training


def test_model_and_batches_follow_the_device_argument():
    learn = _learner(device="cpu")
    assert learn.device == torch.device("cpu")
    assert next(learn.model.parameters()).device.type == "cpu"


def test_dls_must_be_loaders():
    with pytest.raises(TypeError, match="dls"):
        hs.Learner(nn.Linear(3, 2), "data", nn.MSELoss(), progress=False)


def test_show_training_loop_lists_callbacks_per_event(capsys):
    class OnCancelStep(hs.Callback):
        def after_cancel_step(self): ...

    _learner(cbs=[SkipEveryStep(), OnCancelStep()]).show_training_loop()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["after_create", "-"]
    assert any(line.split() == ["before_step", "SkipEveryStep"] for line in lines)
    assert any(line.split() == ["after_batch", "Recorder"] for line in lines)
    assert lines[-1].split() == ["after_cancel_step", "OnCancelStep"]
    assert sum(line.startswith("after_cancel") for line in lines) == 1


class Wrapping(hs.Callback):
    """Wraps every other callback's event method (like CallbackCost): ``functools.wraps``, no ``__self__``."""

    def wrap_method(self, event, method):
        @functools.wraps(method)
        def wrapped(*args):
            return method(*args)

        return wrapped


class InnerWrapping(Wrapping):
    order = -50


def _logged(method):
    @functools.wraps(method)
    def logged(self, *args):
        return method(self, *args)

    return logged


class DecoratedCancel(hs.Callback):
    @_logged
    def after_cancel_step(self): ...


def test_show_training_loop_names_the_callback_under_stacked_wrappers(capsys):
    # two wrappers stacked over each method; the method itself decorated: still the callback's name, once
    _learner(cbs=[SkipEveryStep(), DecoratedCancel(), Wrapping(), InnerWrapping()]).show_training_loop()
    lines = capsys.readouterr().out.splitlines()
    assert any(line.split() == ["before_step", "SkipEveryStep"] for line in lines)
    assert any(line.split() == ["after_batch", "Recorder"] for line in lines)
    assert lines[-1].split() == ["after_cancel_step", "DecoratedCancel"]


def test_run_train_false_keeps_a_callback_out_of_training_batches():
    class ValidOnly(EventLog):
        run_train = False

    log = ValidOnly()
    _learner(cbs=[log]).fit(1)
    assert log.seen.count("before_batch") == 1  # the one validation batch
    assert "before_step" not in log.seen


def test_evaluation_without_validation_data_says_what_to_pass():
    train, _ = _data()
    learn = hs.Learner(nn.Linear(3, 2), hs.DataLoaders(train), nn.CrossEntropyLoss(), progress=False)
    with pytest.raises(ValueError, match=r"validate\(dl\)"):
        learn.validate()
    with pytest.raises(ValueError, match=r"get_preds\(dl\)"):
        learn.get_preds()
    assert set(learn.validate(train)) == {"valid_loss"}


def test_a_batch_without_target_is_predicted_and_a_dict_batch_is_refused():
    x = torch.randn(6, 3)
    learn = _learner()
    preds, targets = learn.get_preds(DataLoader(TensorDataset(x), batch_size=4))
    assert preds.shape == (6, 2) and targets is None
    torch.testing.assert_close(preds, learn.predict(x))

    class Dicts(torch.utils.data.Dataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return {"x": torch.zeros(3)}

    with pytest.raises(TypeError, match="batch must be a tensor or a tuple/list"):
        learn.get_preds(DataLoader(Dicts(), batch_size=2))


def test_loop_counters_follow_fastai_meaning():
    seen = []

    class Counters(hs.Callback):
        def before_batch(self):
            learn = self.learn
            seen.append(
                (learn.training, learn.epoch, learn.iter, learn.n_iter, learn.train_iter, learn.pct_train)
            )

    learn = _learner(cbs=[Counters()])
    learn.fit(2)
    training = [s for s in seen if s[0]]
    assert [s[1:5] for s in training] == [(0, 0, 2, 0), (0, 1, 2, 1), (1, 0, 2, 2), (1, 1, 2, 3)]
    assert [s[5] for s in training] == [0.0, 0.25, 0.5, 0.75]
    assert [s[1:4] for s in seen if not s[0]] == [(0, 0, 1), (1, 0, 1)]
    assert learn.training_step == 4 and learn.train_iter == 4


def test_cancel_fit_in_before_fit_still_removes_per_fit_callbacks():
    log = EventLog()
    learn = _learner()
    learn.fit(1, cbs=[log, RaiseAt("before_fit", CancelFitException())])
    assert log.seen == ["before_fit", "after_cancel_fit", "after_fit"]
    assert learn.cbs == [learn.recorder]
    assert learn.training_step == 0


def test_loss_grad_replaced_in_after_loss_is_what_backward_uses():
    class ZeroLoss(hs.Callback):
        def after_loss(self):
            self.learn.loss_grad = self.learn.loss_grad * 0

    learn = _learner(cbs=[ZeroLoss()], opt_func=torch.optim.SGD)
    before = [p.detach().clone() for p in learn.model.parameters()]
    learn.fit(1, lr=1.0)
    assert learn.training_step == 2
    assert all(loss > 0 for loss in learn.recorder.losses)  # the recorded loss is the true one
    for p, b in zip(learn.model.parameters(), before, strict=True):
        torch.testing.assert_close(p, b)


def test_a_single_metric_or_callback_needs_no_list():
    log = EventLog()
    learn = _learner(cbs=log, metrics=hs.metrics.accuracy)
    learn.fit(1, cbs=SkipEveryStep())
    assert "accuracy" in learn.recorder.history[0] and learn.event_log is log
    assert not hasattr(learn, "skip_every_step")


def test_model_and_loss_are_checked_up_front():
    with pytest.raises(TypeError, match=r"model must be a torch\.nn\.Module"):
        hs.Learner(lambda x: x, _data(), nn.MSELoss(), progress=False)
    with pytest.raises(TypeError, match="loss_func must be callable"):
        hs.Learner(nn.Linear(3, 2), _data(), "mse", progress=False)


def test_no_bar_hides_the_progress_bar_for_the_block_only():
    console = Console(file=io.StringIO(), force_terminal=True)
    learn = _learner(cbs=[hs.callbacks.ProgressBar(console=console)])
    with learn.no_bar():
        learn.fit(1)
        assert not hasattr(learn, "progress_bar")
    assert console.file.getvalue() == ""
    with learn.no_mbar():
        learn.fit(1)
    assert console.file.getvalue() == "" and learn.progress_bar.learn is learn


def test_to_bf16_to_fp16_and_to_fp32_add_and_remove_mixed_precision():
    learn = _learner()
    assert learn.to_fp16() is learn and learn.mixed_precision.requested_dtype == torch.float16
    assert learn.to_bf16() is learn and learn.mixed_precision.requested_dtype == torch.bfloat16
    assert sum(isinstance(cb, hs.callbacks.MixedPrecision) for cb in learn.cbs) == 1
    learn.fit(1)
    assert learn.training_step == 2
    assert learn.to_fp32() is learn and not hasattr(learn, "mixed_precision")


def test_learn_x_and_y_are_the_first_input_and_target():
    seen = []

    class XY(hs.Callback):
        def before_batch(self):
            seen.append(self.learn.x is self.learn.xb[0] and self.learn.y is self.learn.yb[0])

    _learner(cbs=[XY()]).fit(1)
    assert seen == [True, True, True]


def test_remove_cb_takes_a_class_and_detaches_the_callback():
    log = EventLog()
    learn = _learner(cbs=[log])
    learn.remove_cb(EventLog)
    assert learn.cbs == [learn.recorder] and not hasattr(learn, "event_log")
    assert log.learn is None


def test_raw_tensors_are_refused_naming_the_loader_to_build():
    x, y = torch.randn(16, 3), torch.randint(0, 2, (16,))
    with pytest.raises(TypeError, match=r"\(Tensor\[16, 3\], Tensor\[16\]\).*DataLoaders\.from_tensors"):
        hs.Learner(nn.Linear(3, 2), (x, y), nn.CrossEntropyLoss(), progress=False)


def test_training_batches_without_targets_are_refused_at_the_first_batch():
    x = torch.randn(8, 3)
    learn = hs.Learner(
        nn.Linear(3, 2), (DataLoader(TensorDataset(x), batch_size=4),), nn.CrossEntropyLoss(), progress=False
    )
    with pytest.raises(ValueError, match=r"no targets \(one item each: \(Tensor\[4, 3\]\)\).*\(x, y\)"):
        learn.fit(1)
    assert learn.training_step == 0


def test_fit_with_a_callback_class():  # article 004: learn.fit(3, cbs=[GradientClip])
    from hookscope.callbacks import GradientClip
    from hookscope.testing import synth_learner

    learn = synth_learner()
    learn.fit(3, cbs=[GradientClip])
    assert len(learn.recorder.history) == 3
    assert not any(isinstance(cb, GradientClip) for cb in learn.cbs)
    learn.fit_one_cycle(1, cbs=GradientClip)  # a bare class, as fastai also accepts
    assert len(learn.recorder.history) == 1


def test_learner_cbs_class_and_bad_item():
    from hookscope.callbacks import GradientClip, Recorder
    from hookscope.testing import synth_learner

    learn = synth_learner(cbs=[GradientClip, Recorder], progress=False)
    assert isinstance(learn.gradient_clip, GradientClip)
    assert sum(isinstance(cb, Recorder) for cb in learn.cbs) == 1
    with pytest.raises(TypeError, match="cbs: 42 is not a callback"):
        synth_learner(cbs=[42])
    with pytest.raises(TypeError, match="cbs: 42 is not a callback"):
        synth_learner().fit(1, cbs=[42])
