"""The training-loop events and the exceptions that cancel a stage, written out literally.

The vocabulary is fastai's, so a fastai user's callbacks read the same here. Raising a stage's cancel
exception from a callback skips the rest of that stage; the loop then fires ``after_cancel_<stage>``
followed by ``after_<stage>``. Any other exception fires ``on_failure(exc)`` and propagates unchanged.
"""

from __future__ import annotations

EVENTS: tuple[str, ...] = (
    "after_create",
    "before_fit",
    "before_epoch",
    "before_train",
    "before_batch",
    "after_pred",
    "after_loss",
    "before_backward",
    "after_backward",
    "before_step",
    "after_step",
    "after_batch",
    "after_train",
    "before_validate",
    "after_validate",
    "after_epoch",
    "after_fit",
    "after_cancel_fit",
    "after_cancel_epoch",
    "after_cancel_train",
    "after_cancel_validate",
    "after_cancel_batch",
    "after_cancel_backward",
    "after_cancel_step",
    "on_failure",
)

BATCH_EVENTS: tuple[str, ...] = (
    "before_batch",
    "after_pred",
    "after_loss",
    "before_backward",
    "after_backward",
    "before_step",
    "after_step",
    "after_batch",
    "after_cancel_batch",
    "after_cancel_backward",
    "after_cancel_step",
)


class CancelFitException(Exception):
    """Stop training now; ``after_cancel_fit`` then ``after_fit`` fire."""


class CancelEpochException(Exception):
    """Skip the rest of this epoch; ``after_cancel_epoch`` then ``after_epoch`` fire."""


class CancelTrainException(Exception):
    """Skip the rest of this epoch's training phase; validation still runs."""


class CancelValidException(Exception):
    """Skip the rest of this epoch's validation phase."""


class CancelBatchException(Exception):
    """Skip the rest of this batch; ``after_cancel_batch`` then ``after_batch`` fire."""


class CancelBackwardException(Exception):
    """Skip the backward pass of this batch (and so its step)."""


class CancelStepException(Exception):
    """Skip ``opt.step()`` for this batch; ``opt.zero_grad()`` still runs."""
