"""Checkpoint: save the full training state during ``fit`` so a run that dies loses (almost) nothing.

Files in ``dir``: ``ckpt-<training step>.pt`` (the newest ``keep_last`` are kept), ``last.pt`` (always the
newest complete checkpoint) and ``best.pt`` (the best epoch by ``monitor``). ``last.pt`` and ``best.pt``
are hard links, so they cost no extra disk and survive the rotation of the numbered files. Resume with
``learn.fit(n_epoch, resume="last")`` (or a path).

Ctrl-C during ``fit`` does not kill the step half-way: the first press asks for a stop, the current
training batch (or the epoch's validation) finishes, a checkpoint is written, the resume command is printed
and ``KeyboardInterrupt`` is raised (exit code non-zero). A second press stops at once without saving.
An LR sweep (``lr_find``) writes nothing.

One writer per folder: during ``fit`` the folder is locked (:mod:`hookscope.folder_lock`), so a second
fit saving to the same folder — in this process or another — is refused at its start in one line naming
the holder, instead of both writing ``last.pt``.

Under torchrun every rank saves together (each rank's RNGs go into the file), rank 0 writes, and a Ctrl-C
(torchrun passes it to every rank) stops all ranks after the same step: whether any rank was interrupted
is all-reduced once per step while ``sigint`` is on.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Literal

import torch

from hookscope._deprecation import renamed_keywords
from hookscope.doctor.timing.stalls import CHECKPOINT_SAVE
from hookscope.folder_lock import FolderLock
from hookscope.train import distributed
from hookscope.train.callback import Callback
from hookscope.train.checkpoint import Position, find_latest, link_atomic, save_learner
from hookscope.train.checkpoint.sharded import remove_unreferenced


class Checkpoint(Callback):
    """Save every ``every_n_steps`` optimizer steps and/or at every epoch's end; keep the last ``keep_last``
    and, when ``monitor`` names a history key (``"valid_loss"``, ``"accuracy"``), the best as ``best.pt``.

    Runs late (``order=90``), after the Recorder and the schedulers, so a checkpoint holds this batch's
    records. ``sigint=False`` leaves Ctrl-C alone. A model sharded with FSDP2 (or any, with
    ``sharded=True``) saves its tensors through ``torch.distributed.checkpoint``: each rank writes its
    shards into ``ckpt-<step>.dcp/`` beside ``ckpt-<step>.pt`` (see ``train/checkpoint/sharded.py``).
    ``lock``: hold the folder's writer lock during the fit (``True``), a lock its owner holds (a
    :class:`~hookscope.callbacks.RunFolder` passes its run's), or none (``False``).
    ``allow_other_run=True`` lets ``fit(resume=...)`` continue a checkpoint that another run wrote (other
    model, data, loss, optimizer or lr), which is refused otherwise (``hookscope train --allow-other-run``).
    """

    order = 90
    run_valid = False
    run_during_sweep = False  # an lr_find sweep's weights must never become last.pt

    @renamed_keywords(dir="path")
    def __init__(
        self,
        path: str | os.PathLike[str] = "checkpoints",
        every_n_steps: int | None = None,
        every_epoch: bool = True,
        keep_last: int = 1,
        monitor: str | None = None,
        mode: Literal["min", "max"] = "min",
        sigint: bool = True,
        sharded: bool = False,
        lock: bool | FolderLock = True,
        allow_other_run: bool = False,
    ) -> None:
        if every_n_steps is not None and every_n_steps < 1:
            raise ValueError(f"Checkpoint: every_n_steps={every_n_steps}; pass a positive int or None")
        if keep_last < 1:
            raise ValueError(f"Checkpoint: keep_last={keep_last}; keep at least 1 checkpoint")
        if mode not in ("min", "max"):
            raise ValueError(f"Checkpoint: mode={mode!r}; use 'min' (losses) or 'max' (accuracies)")
        self.dir = Path(path)
        self.every_n_steps = every_n_steps
        self.every_epoch = every_epoch
        self.keep_last = keep_last
        self.monitor = monitor
        self.mode = mode
        self.sigint = sigint
        self.sharded = sharded
        self.allow_other_run = allow_other_run
        self._own_lock = lock is True
        self.lock = FolderLock(self.dir, "the checkpoint folder") if lock is True else (lock or None)
        self.best: float | None = None
        self._last_saved_step = -1
        self._interrupted = False
        self._stopped = False
        self._previous_handler: Any = None

    @staticmethod
    def latest(path: str | os.PathLike[str]) -> Path:
        """The newest checkpoint under ``path``: ``path/last.pt`` or ``path/checkpoints/last.pt`` (or
        ``path`` itself when it is a file): what ``fit(resume=...)`` and ``hookscope train --resume`` read."""
        return find_latest(path)

    # ---- events --------------------------------------------------------------------------------------

    def before_fit(self) -> None:
        if self.lock is not None and distributed.is_rank_zero():
            self.lock.acquire()  # before anything in the folder is touched
        for stale in self.dir.glob(".*.tmp") if distributed.is_rank_zero() else ():  # a killed write's
            stale.unlink(missing_ok=True)
        self._check_monitor()
        self._interrupted = self._stopped = False
        self._last_saved_step = self.learn.training_step
        if self.sigint and threading.current_thread() is threading.main_thread():
            self._previous_handler = signal.signal(signal.SIGINT, self._on_sigint)

    def after_batch(self) -> None:
        learn = self.learn
        step = learn.training_step
        step_due = self.every_n_steps is not None and step % self.every_n_steps == 0
        if not (self._stop_requested() or (step_due and step != self._last_saved_step)):
            return
        path = self._save(Position(learn.epoch, learn.iter + 1, learn.train_iter, step))
        self._stop_if_interrupted(path)

    def after_epoch(self) -> None:
        learn = self.learn
        improved = self._improved()
        if not (self.every_epoch or improved or self._stop_requested()):
            return
        path = self._save(Position(learn.epoch + 1, 0, learn.train_iter, learn.training_step))
        if improved and distributed.is_rank_zero():
            link_atomic(path, self.dir / "best.pt")
        self._stop_if_interrupted(path)

    def after_fit(self) -> None:
        self._restore_handler()
        self._release()

    def on_failure(self, exc: BaseException) -> None:
        self._restore_handler()
        self._release()
        if self._stopped:
            return  # our own stop after a Ctrl-C: the hint is already printed
        last = self.dir / "last.pt"
        if last.is_file() and distributed.is_rank_zero():
            print(
                f"hookscope: training stopped by {type(exc).__name__}; the newest complete checkpoint is "
                f"{last} — resume with learn.fit({self.learn.n_epoch}, resume={str(last)!r})",
                file=sys.stderr,
            )

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best = state.get("best")

    # ---- helpers -------------------------------------------------------------------------------------

    def _save(self, position: Position) -> Path:
        """Write ``ckpt-<step>.pt``, point ``last.pt`` at it, drop numbered files beyond ``keep_last``; the
        Doctor, when there is one, is told (a slow step then names the save)."""
        if hasattr(doctor := getattr(self.learn, "doctor", None), "note"):
            doctor.note(CHECKPOINT_SAVE)
        path = self.dir / f"ckpt-{position.training_step:08d}.pt"
        path = save_learner(self.learn, path, position, sharded=self.sharded)
        self._last_saved_step = position.training_step
        if not distributed.is_rank_zero():  # rank 0 writes; the others took part in save_learner
            return path
        link_atomic(path, self.dir / "last.pt")
        for old in sorted(self.dir.glob("ckpt-*.pt"))[: -self.keep_last]:
            old.unlink(missing_ok=True)
        remove_unreferenced(self.dir)  # a sharded checkpoint's tensors go with its last file
        return path

    def _improved(self) -> bool:
        """Whether this epoch's ``monitor`` value beats the best so far (NaN never does); updates best."""
        if self.monitor is None:
            return False
        value = float(self.learn.recorder.history[-1][self.monitor])
        if math.isnan(value):
            return False
        better = self.best is None or (value < self.best if self.mode == "min" else value > self.best)
        if better:
            self.best = value
        return better

    def _check_monitor(self) -> None:
        """Fail at the start of the fit, not after the first epoch, when ``monitor`` is not recorded."""
        if self.monitor is None:
            return
        available = ["train_loss", "valid_loss", *self.learn.recorder.metric_names]
        if self.monitor not in available:
            raise KeyError(
                f"Checkpoint: monitor={self.monitor!r} is not in learn.recorder.history "
                f"(available: {', '.join(available)}); pass one of those"
            )

    def _stop_requested(self) -> bool:
        """Whether Ctrl-C reached this rank — under torchrun, any rank: all must save the same step."""
        if self.sigint and distributed.is_distributed():
            self._interrupted = bool(distributed.any_rank(torch.tensor(self._interrupted)))
        return self._interrupted

    def _on_sigint(self, signum: int, frame: object) -> None:
        if self._interrupted:
            raise KeyboardInterrupt("second Ctrl-C: stopped at once, without a checkpoint of this step")
        self._interrupted = True
        finishing = "this step" if self.learn.training else "this epoch's validation"
        if not distributed.is_rank_zero():
            return
        print(
            f"hookscope: Ctrl-C — finishing {finishing} and saving a checkpoint (press Ctrl-C again to "
            "stop at once without saving)",
            file=sys.stderr,
            flush=True,
        )

    def _stop_if_interrupted(self, path: Path) -> None:
        if not self._interrupted:
            return
        learn = self.learn
        last = str(self.dir / "last.pt")
        message = (
            # epochs are shown from 1, as `hookscope train` and the progress bar count them
            f"interrupted at epoch {learn.epoch + 1}, step {learn.training_step}; "
            f"checkpoint saved to {path}. "
            f"To continue, repeat the same fit call with resume={last!r}, e.g. "
            f"learn.fit({learn.n_epoch}, resume={last!r})"
        )
        if distributed.is_rank_zero():
            print(f"hookscope: {message}", file=sys.stderr, flush=True)
        self._stopped = True
        raise KeyboardInterrupt(message)

    def _release(self) -> None:
        if self._own_lock and self.lock is not None:
            self.lock.release()

    def _restore_handler(self) -> None:
        if self._previous_handler is not None:
            signal.signal(signal.SIGINT, self._previous_handler)
            self._previous_handler = None
