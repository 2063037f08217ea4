"""The phases a training step's time is split into, and the columns of a timing row.

A step runs from the end of the previous optimizer step to the end of this one, and every moment of it
belongs to exactly one phase, so the phases add up to the step's time:

- ``data``: from the end of the previous step to the start of this step's first training forward — the
  loader's ``next()``, the copy to the device and ``zero_grad`` in a hand-written loop. In the Learner
  the callbacks that run then (``before_batch``, an ``after_batch`` after the doctor's, a checkpoint
  save) are timed and go to ``other`` (:func:`callbacks_to_other`): they are not the loader's time.
  When the model's own forward is never seen (a framework that calls a submodule), it ends where the
  loop says the batch begins (``begin_batch``).
- ``forward``: the model's root forward (its pre-hook to its post-hook); without those, up to the logged
  loss.
- ``backward``: the loss computation and the backward, up to "gradients are final" (``gradients_ready``).
  Under gradient accumulation the micro-batches after the first one land in ``forward`` and ``backward``.
- ``optimizer``: ``gradients_ready`` to ``step_done`` (clipping, unscaling, ``optimizer.step``).
- ``other``: ``step_done`` to the end of the step (the Learner's ``after_step`` and ``after_batch``
  callbacks, schedulers), and the callbacks' time taken out of ``data``.

``valid`` (validation between steps) is timed but belongs to no step; ``gc`` is the garbage collector's
time inside the step and ``wait`` the time the training's threads waited for a core (a busy machine), both
host time and also part of the phases above.
"""

from __future__ import annotations

import numpy as np

DATA, FORWARD, BACKWARD, OPTIMIZER, OTHER, VALID, GC, WAIT = range(8)
PHASES = ("data", "forward", "backward", "optimizer", "other")
COLUMNS = (*PHASES, "valid", "gc", "wait")
STEP_PHASES = len(PHASES)  # the first columns, whose sum is the step's time


def callbacks_to_other(row: np.ndarray | list[float], seconds: float) -> None:
    """Move the ``seconds`` callbacks ran inside the data phase of ``row`` to ``other``: the loop ran
    them, it did not wait for data (at most the whole data phase: on a GPU the phase is device time)."""
    moved = min(seconds, row[DATA])
    row[DATA] -= moved
    row[OTHER] += moved
