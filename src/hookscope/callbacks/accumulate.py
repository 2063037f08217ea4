"""Gradient accumulation: one optimizer step per ``n_batches`` batches, as if they were one big batch.

The loss that goes into backward is divided by the number of batches in the group, so the summed
gradients equal the gradient of one batch ``n_batches`` times larger. That holds for a mean-reduced loss
(PyTorch's default) and equal batch sizes; with ``reduction="sum"`` the division makes the gradients
``n_batches`` times smaller than the big batch's. Between steps the batch is cancelled after backward,
which skips ``opt.step()`` and ``opt.zero_grad()`` so the gradients keep adding up. ``learn.loss`` stays
the true per-batch loss, so the Recorder and loggers see unscaled values.

Under torchrun only the last micro-batch of a group reduces gradients across ranks (DDP's ``no_sync``,
FSDP2's ``set_requires_gradient_sync``): the others add to this rank's gradients, and the one reduction
averages the sums — the same gradients, one all-reduce (or reduce-scatter) per step instead of one per
micro-batch.
"""

from __future__ import annotations

from hookscope.train.callback import Callback
from hookscope.train.events import CancelBatchException


class GradientAccumulation(Callback):
    """Step the optimizer once every ``n_batches`` training batches (and at the end of each epoch).

    The last group of an epoch may be shorter when ``len(dls.train)`` is not a multiple of
    ``n_batches``; its loss is divided by its own length, so it still averages its batches.
    Works with ``MixedPrecision``: the scaled loss is scaled again, the unscale happens once per step.
    """

    # Early, so callbacks that read gradients in after_backward (statistics, guards) run after the
    # cancel and only ever see the gradients of complete groups.
    order = -10
    run_valid = False

    def __init__(self, n_batches: int) -> None:
        if not isinstance(n_batches, int) or n_batches < 1:
            raise ValueError(f"GradientAccumulation: n_batches={n_batches!r} must be an int >= 1")
        self.n_batches = n_batches

    def before_batch(self) -> None:
        # under torchrun, gradients are reduced across ranks once per group, on its last micro-batch
        last = self.learn.iter + 1 >= self._group_end()
        self.learn.distributed.set_gradient_sync(self.learn.model, last)

    def after_fit(self) -> None:
        self.learn.distributed.set_gradient_sync(self.learn.model, True)

    def after_loss(self) -> None:
        size = self._group_end() - self._group_start()
        if size > 1:
            self.learn.loss_grad = self.learn.loss_grad / size

    def after_backward(self) -> None:
        if self.learn.iter + 1 < self._group_end():
            raise CancelBatchException()

    def _group_start(self) -> int:
        return self.learn.iter // self.n_batches * self.n_batches

    def _group_end(self) -> int:
        return min(self._group_start() + self.n_batches, self.learn.n_iter)
