import pytest

import hookscope as hs
from hookscope.train.callback import dispatch_table, sort_callbacks


class A(hs.Callback):
    def before_fit(self): ...


class B(hs.Callback):
    order = -5

    def before_fit(self): ...


class C(hs.Callback):
    run_after = (A,)

    def after_batch(self): ...


class GradientClipCallback(hs.Callback):
    pass


def _names(cbs):
    return [type(cb).__name__ for cb in cbs]


def test_order_sorts_and_ties_keep_insertion_order():
    assert _names(sort_callbacks([A(), B(), GradientClipCallback()])) == ["B", "A", "GradientClipCallback"]


def test_run_after_and_run_before_move_callbacks_past_their_order():
    c, a = C(), A()
    c.order = -10
    assert _names(sort_callbacks([c, a])) == ["A", "C"]

    class Early(hs.Callback):
        order = 50
        run_before = ("B",)

    assert _names(sort_callbacks([B(), Early()])) == ["Early", "B"]


def test_a_cycle_names_the_callbacks_involved():
    class X(hs.Callback):
        run_before = ("Y",)

    class Y(hs.Callback):
        run_before = ("X",)

    with pytest.raises(hs.CallbackOrderError, match=r"cycle among: X, Y"):
        sort_callbacks([A(), X(), Y()])


def test_dispatch_table_holds_only_callbacks_defining_the_event():
    a, c = A(), C()
    table = dispatch_table([a, c], training=True)
    assert table["before_fit"] == [a.before_fit]
    assert table["after_batch"] == [c.after_batch]
    assert table["before_step"] == []


def test_run_train_and_run_valid_filter_only_batch_events():
    class ValidOnly(hs.Callback):
        run_train = False

        def after_batch(self): ...

        def after_epoch(self): ...

    cb = ValidOnly()
    train, valid = dispatch_table([cb], training=True), dispatch_table([cb], training=False)
    assert train["after_batch"] == [] and valid["after_batch"] == [cb.after_batch]
    assert train["after_epoch"] == valid["after_epoch"] == [cb.after_epoch]


def test_name_is_snake_case_without_the_callback_suffix():
    assert GradientClipCallback().name == "gradient_clip"
    assert A().name == "a"
    assert hs.callbacks.Recorder().name == "recorder"
    assert hs.callbacks.ProgressBar().name == "progress_bar"
