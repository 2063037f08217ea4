"""Resuming a fit from a checkpoint, exactly, also in the middle of an epoch.

Exact mid-epoch resume needs two RNG snapshots: the one taken at the start of the epoch's training phase
(replaying it reproduces the sampler's shuffle, so the same remaining batches come in the same order) and
the one at the moment of the save (so dropout and augmentations continue the same stream). Under torchrun
each rank takes its own pair from the checkpoint's ``ranks`` (and the sampler seed every rank shares).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hookscope.train import distributed
from hookscope.train.checkpoint.callback_state import load_pending_objects
from hookscope.train.checkpoint.file import CheckpointError, load_checkpoint
from hookscope.train.checkpoint.identity import check_identity
from hookscope.train.checkpoint.learner_state import Position, load_model_and_callbacks, load_optimizer
from hookscope.train.checkpoint.rng import capture_rng, restore_rng, rng_generators

if TYPE_CHECKING:
    from hookscope.train.learner import Learner


class Resume:
    """One resumed ``fit``: applies a checkpoint at the right moments of the loop.

    - :meth:`start` (before ``before_fit``): model weights, callback states (callbacks that build things
      in ``before_fit`` keep the state pending until then), loop counters.
    - :meth:`after_before_fit`: the optimizer (after schedulers were built, so the saved learning rates
      win) and, for a checkpoint taken between epochs, the RNGs. Returns the epoch to start at.
    - :func:`train_batches`: for a mid-epoch checkpoint, the saved epoch's shuffle with the batches
      already done skipped, then the RNGs as they were at the save.
    """

    def __init__(self, state: Mapping[str, Any], source: str) -> None:
        self.state = state
        self.source = source
        pos = state["position"]
        self.position = Position(pos["epoch"], pos["iter"], pos["train_iter"], pos["training_step"])
        self.mid_epoch_pending = self.position.iter > 0
        self.rank_state = _rank_state(state, source)

    @classmethod
    def start(cls, learn: Learner, resume: str | os.PathLike[str]) -> Resume:
        """Read the checkpoint (``"last"``: ``last.pt`` of ``learn.checkpoint``'s folder; a file; or a
        folder holding ``last.pt``) and apply what must precede ``before_fit``."""
        file, state = load_newest(_resume_path(learn, resume))
        check_identity(state.get("identity"), learn, str(file), allowed=_other_run_allowed(learn))
        self = cls(state, str(file))
        saved_n_epoch = self.state["position"]["n_epoch"]
        if saved_n_epoch != learn.n_epoch:
            warnings.warn(
                f"{file} was saved during fit({saved_n_epoch}) and is resumed with fit({learn.n_epoch}); "
                "schedules that span the fit (one-cycle, cosine) change, so the run will differ",
                stacklevel=3,
            )
        if self.position.epoch > 0 and getattr(learn.dls.train, "persistent_workers", False):
            warnings.warn(
                f"resuming {file} at epoch {self.position.epoch} with persistent_workers=True: the new "
                "worker processes start fresh random streams, so random transforms inside workers differ "
                "from the original run; use persistent_workers=False for an exact resume",
                stacklevel=3,
            )
        load_model_and_callbacks(learn, self.state, self.source)
        learn.distributed.seed = self.rank_state.get("sampler_seed", learn.distributed.seed)
        learn.train_iter = self.position.train_iter
        learn.training_step = self.position.training_step
        return self

    def after_before_fit(self, learn: Learner) -> int:
        """Load the optimizer (and, between epochs, the RNGs); return the epoch to start at."""
        load_optimizer(learn, self.state, self.source)
        if not self.mid_epoch_pending:
            restore_rng(self.rank_state["rng"], rng_generators(learn))
        return self.position.epoch


def train_batches(
    learn: Learner, resume: Resume | None, batches_of: Callable[[Any], Iterable[Any]]
) -> tuple[int, Iterator[Any]]:
    """``(index of the first batch, iterator)`` for this epoch's training phase over ``learn.dl``.

    Records the RNGs at the epoch's start (``learn.epoch_rng``) before ``iter(batches_of(learn.dl))``
    draws the shuffle, so a mid-epoch checkpoint can replay it. On a mid-epoch resume: restore that
    epoch-start state, make the iterator, skip the batches already done (fetched, not computed — so
    workers and random transforms advance exactly as in the original run), then restore the RNGs of the
    moment of the save. First, the objects callbacks built in ``before_fit`` / ``before_train`` get the
    states a load kept for them (see ``callback_state.py``).
    """
    load_pending_objects(learn)
    generators = rng_generators(learn)
    if resume is None or not resume.mid_epoch_pending:
        learn.epoch_rng = capture_rng(generators)
        return 0, iter(batches_of(learn.dl))
    resume.mid_epoch_pending = False
    learn.epoch_rng = resume.rank_state["epoch_rng"]
    restore_rng(learn.epoch_rng, generators)
    iterator = iter(batches_of(learn.dl))
    done = resume.position.iter
    for fetched in range(done):
        if next(iterator, None) is None:
            raise CheckpointError(
                f"{resume.source} was saved after batch {done} of epoch {resume.position.epoch}, but the "
                f"epoch now has {fetched} batches; resume with the same training data"
            )
    restore_rng(resume.rank_state["rng"], generators)
    return done, iterator


def _rank_state(state: Mapping[str, Any], source: str) -> dict[str, Any]:
    """This rank's RNGs (``rng``, ``epoch_rng``, and under torchrun ``sampler_seed``) in ``state``.

    A checkpoint saved by another number of processes resumes (the weights and optimizer are the same),
    but the data is split differently, so the run is not exact: a warning says so.
    """
    ranks, world = state.get("ranks"), distributed.world_size()
    saved_by = len(ranks) if ranks is not None else 1
    if saved_by != world:
        warnings.warn(
            f"{source} was saved by {saved_by} process(es) and is resumed by {world}: the data is sharded "
            f"differently, so the run continues but is not an exact replay; resume with {saved_by}",
            stacklevel=4,
        )
    if ranks is None or distributed.rank() >= len(ranks):
        return {"rng": state["rng"], "epoch_rng": state["epoch_rng"]}
    return dict(ranks[distributed.rank()])


def find_latest(path: str | os.PathLike[str]) -> Path:
    """A checkpoint file: ``path`` itself, or ``last.pt`` in the folder ``path`` or its ``checkpoints/``."""
    path = Path(path)
    if not path.is_dir():
        return path
    for candidate in (path / "last.pt", path / "checkpoints" / "last.pt"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"no last.pt in {path} or {path / 'checkpoints'}; pass the checkpoint file itself"
    )


def load_newest(path: str | os.PathLike[str]) -> tuple[Path, dict[str, Any]]:
    """The checkpoint ``path`` names (see :func:`find_latest`) and its state.

    When ``path`` is a folder and its ``last.pt`` cannot be loaded (truncated by a full disk, say), the
    newest other checkpoint there that loads is used instead, with a warning naming both: a run is never
    stuck on one bad file. A checkpoint file named explicitly is loaded or refused, never replaced.
    """
    latest = find_latest(path)
    if latest == Path(path):
        return latest, load_checkpoint(latest)
    failures: list[str] = []
    for candidate in _fallbacks(latest):
        try:
            state = load_checkpoint(candidate)
        except CheckpointError as err:
            failures.append(str(err))
            continue
        if failures:
            warnings.warn(
                f"{latest} cannot be loaded ({failures[0]}); resuming from {candidate}, the newest "
                "checkpoint that loads",
                stacklevel=4,
            )
        return candidate, state
    raise CheckpointError(
        f"{failures[0]}; no other checkpoint in {latest.parent} loads either — resume from a copy you "
        "trust (hookscope train --resume-from FILE), or start over"
    )


def _fallbacks(latest: Path) -> list[Path]:
    """``latest`` first, then the numbered checkpoints beside it newest first, then ``best.pt``; a file
    linked to one already listed (``last.pt`` and ``best.pt`` are hard links) is the same bytes: skipped."""
    numbered = sorted(latest.parent.glob("ckpt-*.pt"), reverse=True)
    best = latest.parent / "best.pt"
    found: list[Path] = []
    seen: set[tuple[int, int]] = set()
    for candidate in [latest, *numbered, *([best] if best.is_file() else [])]:
        stat = candidate.stat()
        if (stat.st_dev, stat.st_ino) not in seen:
            seen.add((stat.st_dev, stat.st_ino))
            found.append(candidate)
    return found


def _other_run_allowed(learn: Learner) -> bool:
    """Whether the Checkpoint callback says ``allow_other_run=True``: resuming another run's checkpoint."""
    checkpoint = next((cb for cb in learn.cbs if cb.name == "checkpoint"), None)
    return bool(getattr(checkpoint, "allow_other_run", False))


def _resume_path(learn: Learner, resume: str | os.PathLike[str]) -> Path:
    if resume != "last":
        return Path(resume)
    checkpoint = next((cb for cb in learn.cbs if cb.name == "checkpoint"), None)
    folder = getattr(checkpoint, "dir", None)
    if folder is None:
        raise ValueError(
            "fit(resume='last') reads last.pt from the Checkpoint callback's folder, but this Learner has "
            "no Checkpoint callback; add cbs=[hs.callbacks.Checkpoint(dir)] or pass resume=PATH"
        )
    return Path(folder)  # a folder, so that an unreadable last.pt falls back to an older checkpoint
