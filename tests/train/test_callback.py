import pytest

import hookscope as hs
from hookscope.train.callback import CallbackOrderError, dispatch_table, sort_callbacks


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

    with pytest.raises(CallbackOrderError, match=r"cycle among: X, Y"):
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


class Log(hs.Callback):
    """Appends (its label, event) to a shared list at the events a composite test watches."""

    def __init__(self, label, calls, order=0, run_valid=True):
        self.label, self.calls, self.order, self.run_valid = label, calls, order, run_valid

    def before_fit(self):
        self.calls.append((self.label, "before_fit"))

    def after_batch(self):
        self.calls.append((self.label, "after_batch", self.learn.training))


class WithCompanions(Log):
    def __init__(self, calls, companions):
        super().__init__("whole", calls, order=0)
        self._companions = companions

    @property
    def companions(self):
        return self._companions


def test_companions_join_the_learner_beside_their_owner_run_at_their_own_order_and_leave_with_it():
    from small_learner import tiny_learner

    calls = []
    late, early = Log("late", calls, order=50), Log("early", calls, order=-50, run_valid=False)
    other = Log("other", calls, order=10)
    owner = WithCompanions(calls, [late, early])
    learn = tiny_learner(cbs=[owner, other])
    assert late in learn.cbs and early in learn.cbs and late.learn is learn
    assert learn.log is other  # companions are not bound as learn.<name>, so they clash with nothing
    learn.fit(1)
    assert calls[:4] == [("early", "before_fit"), ("whole", "before_fit"), ("other", "before_fit"),
                         ("late", "before_fit")]  # fmt: skip
    valid_labels = {c[0] for c in calls if c[1] == "after_batch" and c[2] is False}
    assert valid_labels == {"other", "late", "whole"}  # run_valid=False holds for a companion too
    learn.remove_cb(owner)
    assert learn.cbs[-1] is other and late not in learn.cbs and early not in learn.cbs
    assert late.learn is None and early.learn is None


def test_companions_of_a_callback_given_to_fit_leave_with_it():
    from small_learner import tiny_learner

    calls = []
    companion = Log("companion", calls)
    learn = tiny_learner()
    before = list(learn.cbs)
    learn.fit(1, cbs=[WithCompanions(calls, [companion])])
    assert ("companion", "before_fit") in calls and learn.cbs == before


def test_wrap_method_sees_every_other_method_of_the_table():
    seen = []

    class Tracer(hs.Callback):
        order = -100

        def wrap_method(self, event, method):
            seen.append((event, type(method.__self__).__name__))
            return method

    a, c = A(), C()
    dispatch_table(sort_callbacks([Tracer(), a, c]), training=True)
    assert seen == [("before_fit", "A"), ("after_batch", "C")]


def test_validate_reads_what_the_recorder_put_in_valid_record():
    from small_learner import tiny_learner

    learn = tiny_learner()
    results = learn.validate()
    assert set(results) == {"valid_loss"}
    assert results["valid_loss"] == pytest.approx(float(learn.valid_record["valid_loss"]))
    learn.remove_cb(learn.recorder)
    assert learn.validate() == results  # a Recorder attached for that call only measures it


def test_a_callback_class_in_cbs_is_created_with_no_arguments():
    from hookscope.callbacks import GradientClip
    from hookscope.train.callback import as_callbacks

    clip = GradientClip(0.5)
    cbs = as_callbacks([GradientClip, clip])
    assert isinstance(cbs[0], GradientClip) and cbs[0].max_norm == 1.0
    assert cbs[1] is clip
    assert isinstance(as_callbacks(GradientClip)[0], GradientClip)
    assert as_callbacks(None) == [] and as_callbacks(()) == []


@pytest.mark.parametrize("item", [42, "GradientClip", int, lambda: None])
def test_anything_else_in_cbs_is_one_type_error_naming_it(item):
    from hookscope.train.callback import as_callbacks

    with pytest.raises(TypeError, match=r"cbs: .* is not a callback; pass a Callback instance") as error:
        as_callbacks([A(), item])
    assert repr(item) in str(error.value)


def test_run_before_may_be_a_bare_class_or_name_as_fastai_writes_it():
    from hookscope.callbacks import Recorder
    from hookscope.testing import synth_learner

    class CycleGANTrainer(hs.Callback):
        run_before = Recorder

    class ByName(hs.Callback):
        order = -30
        run_after = "CycleGANTrainer"

    learn = synth_learner(cbs=[CycleGANTrainer(), ByName()], progress=False)
    assert _names(sort_callbacks(learn.cbs)) == ["CycleGANTrainer", "ByName", "Recorder"]
