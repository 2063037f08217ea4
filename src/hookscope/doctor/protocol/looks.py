"""Which training steps the protocol's device checks look at: densely at the start, in short looks after.

Three checks put work on the device at a step — ``repeated_batch`` fingerprints the input,
``unshuffled_data`` copies the labels, ``graph_kept_alive`` tags the output's graph — and inside a step
each such op costs several times its time alone (the step's tensors push the interpreter out of the
caches). Two more run host code that costs as much there: ``stale_gradients`` hooks a few parameters
(a call from autograd into Python at every backward), ``train_in_eval_mode`` reads every mode-dependent
module's flag at each forward. The mistakes they catch are in the program from its first step
(``next(iter(loader))`` in the loop, a dataset sorted by label, ``total += loss``, no ``zero_grad``), or
begin where the loop changes course: after a validation pass, when the model's mode changes
(``model.eval()``), at a resume, in a second fit. So :class:`Looks` watches every step of the first
:data:`DENSE`, then :data:`WINDOW` consecutive steps every :data:`PERIOD`, and the :data:`WINDOW` steps
after each of those changes of course (a batch that does not train, a change of the model's mode, an
attach, a resume). A mistake there from the start is named as promptly as before; one that begins late,
on one of the unwatched steps, is named at the next look, at most :data:`PERIOD` steps later
(``graph_kept_alive`` needs a few looks: its count of live graphs must pass :data:`~.graphs.KEPT`).

Evaluation forwards (no autograd, or the model in eval mode) are always read: ``eval_in_train_mode`` and
the graphs of an evaluation with autograd need no look. The learning rate is read at every step.
"""

from __future__ import annotations

from hookscope.doctor.schedule import RecordingSchedule

DENSE = 32  # the first steps, all watched: most loop mistakes are there from the first step
WINDOW = 4  # consecutive steps in a look: repeated_batch needs REPEATS (3) equal inputs in a row
PERIOD = 32  # steps between the starts of two looks


class Looks:
    """Whether the training step that begins is watched (:attr:`watching`), decided at each batch on a
    :class:`~hookscope.doctor.schedule.RecordingSchedule` that a change of course tightens."""

    def __init__(self) -> None:
        self.watching = True
        self.schedule = RecordingSchedule(warmup=DENSE, every=PERIOD, window=WINDOW)
        self._restarted = True  # the next training step starts a look

    def restart(self) -> None:
        """The loop changed course (an attach, a resume, a batch that does not train): watch the next
        :data:`WINDOW` training steps."""
        self._restarted = True

    def begin_batch(self, step: int, training: bool) -> None:
        if not training:
            self.restart()
            self.watching = True  # what a validation forward does is watched too (its graphs)
            return
        if self._restarted:
            self.schedule.tighten(step + WINDOW)
            self._restarted = False
        self.watching = self.schedule(step)
