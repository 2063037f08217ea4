import pytest

from hookscope.train.events import (
    BATCH_EVENTS,
    EVENTS,
    CancelBackwardException,
    CancelBatchException,
    CancelEpochException,
    CancelFitException,
    CancelStepException,
    CancelTrainException,
    CancelValidException,
)

STAGES = {
    "fit": CancelFitException,
    "epoch": CancelEpochException,
    "train": CancelTrainException,
    "validate": CancelValidException,
    "batch": CancelBatchException,
    "backward": CancelBackwardException,
    "step": CancelStepException,
}


@pytest.mark.parametrize("stage", STAGES)
def test_every_stage_has_its_before_after_and_after_cancel_events(stage):
    assert f"after_{stage}" in EVENTS and f"after_cancel_{stage}" in EVENTS
    assert f"before_{stage}" in EVENTS


def test_cancel_exceptions_are_distinct_plain_exceptions():
    assert len(set(STAGES.values())) == 7
    for exc in STAGES.values():
        assert issubclass(exc, Exception)
        for other in STAGES.values():
            assert other is exc or not issubclass(exc, other)


def test_batch_events_are_events_in_loop_order():
    assert set(BATCH_EVENTS) <= set(EVENTS)
    loop = [e for e in EVENTS if e in BATCH_EVENTS and not e.startswith("after_cancel")]
    assert loop == [
        "before_batch",
        "after_pred",
        "after_loss",
        "before_backward",
        "after_backward",
        "before_step",
        "after_step",
        "after_batch",
    ]


def test_the_failure_event_is_on_failure():
    assert "on_failure" in EVENTS
