"""Saving and loading a Learner's full state: model, pending gradients, optimizer, callbacks, RNGs, position.

Callbacks carry the rest of the run (recorder history, schedulers, the grad scaler, ...) through their
``state_dict``, so this module knows no callback by name. Loading checks that model and optimizer fit
before anything is changed, so a refused load leaves the Learner as it was.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from hookscope.train import distributed
from hookscope.train.checkpoint import sharded as dcp_files
from hookscope.train.checkpoint.callback_state import (
    check_callback_states,
    check_param_groups,
    load_callback_states,
    save_callback_states,
)
from hookscope.train.checkpoint.file import CheckpointError, load_checkpoint, write_checkpoint
from hookscope.train.checkpoint.identity import run_identity
from hookscope.train.checkpoint.rng import capture_rng, rank_states, rng_generators
from hookscope.train.checkpoint.sharded import uses_sharded_format
from hookscope.train.checkpoint.weights import check_model_state, unwrap

if TYPE_CHECKING:
    from hookscope.train.learner import Learner


@dataclass(frozen=True)
class Position:
    """Where the loop stands: ``iter`` training batches of ``epoch`` are done (0 = at the epoch's start);
    ``train_iter`` training batches in the whole fit, ``training_step`` optimizer steps ever."""

    epoch: int
    iter: int
    train_iter: int
    training_step: int


def current_position(learn: Learner) -> Position:
    """The position after the last completed training batch, from ``learn.train_iter``.

    Inside ``after_batch`` the current batch already counts (``train_iter`` advances before that event,
    as in fastai), so a save there resumes at the next batch.
    """
    n_iter = max(len(learn.dls.train), 1)
    epoch, done = divmod(learn.train_iter, n_iter)
    return Position(epoch, done, learn.train_iter, learn.training_step)


def save_learner(
    learn: Learner, path: str | os.PathLike[str], position: Position | None = None, sharded: bool = False
) -> Path:
    """Write the full state of ``learn`` to ``path`` atomically: model, pending gradients (mid
    accumulation), optimizer, every callback's ``state_dict`` (recorder history, schedulers, grad scaler,
    the optimizers and modules a callback owns, ...), every RNG, the loop position and the run's
    identity (see ``identity.py``). An optimizer that a callback owns and swapped in as ``learn.opt`` is
    stored once, in that callback's state.

    Under torchrun every rank calls this together (callback states and RNGs are gathered), rank 0 writes
    the file, and the others wait at a barrier until it is written. A sharded model (or ``sharded=True``)
    writes its model and optimizer tensors through DCP instead, each rank its shards (``sharded.py``)."""
    position = position or current_position(learn)
    callbacks = save_callback_states(learn)
    opt = learn.opt if callbacks["optimizer_owner"] is None else None
    dcp = (
        dcp_files.save_tensors(unwrap(learn.model), opt, Path(path))
        if uses_sharded_format(learn, sharded)
        else {}
    )
    state = {
        **dcp,
        "model": unwrap(learn.model).state_dict() if not dcp else {},
        "grads": _grads(learn.model) if not dcp else {},
        "optimizer": opt.state_dict() if opt is not None and not dcp else None,
        "optimizer_type": type(opt).__name__ if opt is not None else None,
        **callbacks,
        "position": {
            "epoch": position.epoch,
            "iter": position.iter,
            "train_iter": position.train_iter,
            "training_step": position.training_step,
            "n_epoch": learn.n_epoch,
        },
        "rng": capture_rng(rng_generators(learn)),
        "epoch_rng": learn.epoch_rng if position.iter else None,
        **rank_states(learn, mid_epoch=bool(position.iter)),
        "identity": run_identity(learn),  # whose run it is: a resume continues its own run only
    }
    written = write_checkpoint(state, path) if distributed.is_rank_zero() else Path(path)
    distributed.barrier()
    return written


def load_learner(learn: Learner, path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load model, optimizer and callback states from ``path`` into ``learn``; returns the checkpoint.

    The next ``fit`` starts at epoch 0 with these weights; ``fit(n, resume=path)`` continues instead.
    """
    state = load_checkpoint(path)
    load_model_and_callbacks(learn, state, str(path))
    load_optimizer(learn, state, str(path))
    return state


def load_model_and_callbacks(learn: Learner, state: Mapping[str, Any], source: str) -> None:
    """Check that ``state`` fits ``learn``, then load the model, its pending gradients and the callbacks'
    states: everything but the optimizer, which a resumed fit loads only once ``before_fit`` has built
    the schedulers (so the saved learning rates win)."""
    _check_fits(learn, state, source)
    if "sharded" in state:
        dcp_files.load_model(unwrap(learn.model), state, source)
    else:
        unwrap(learn.model).load_state_dict(state["model"])
    _load_grads(learn.model, state["grads"])
    load_callback_states(learn, state["callbacks"], source)


def load_optimizer(learn: Learner, state: Mapping[str, Any], source: str = "") -> None:
    """Load the optimizer state, when the checkpoint has one (a Learner saved before any fit has none)."""
    if "sharded" in state:
        if learn.opt is None:
            learn.create_opt()
        dcp_files.load_optimizer(unwrap(learn.model), learn.opt, state, source)
    elif state["optimizer"] is not None:
        learn.opt.load_state_dict(state["optimizer"])


def _grads(model: nn.Module) -> dict[str, torch.Tensor]:
    """Gradients not yet consumed by a step (mid gradient-accumulation); empty after ``zero_grad``."""
    return {name: p.grad for name, p in unwrap(model).named_parameters() if p.grad is not None}


def _load_grads(model: nn.Module, grads: Mapping[str, torch.Tensor]) -> None:
    for name, param in unwrap(model).named_parameters():
        param.grad = grads[name].to(param.device, param.dtype) if name in grads else None


def _check_fits(learn: Learner, state: Mapping[str, Any], source: str) -> None:
    """Refuse, before anything is changed, a checkpoint whose model, optimizer or callbacks do not fit
    ``learn``."""
    if "sharded" not in state:  # sharded tensors are checked by DCP as they load
        check_model_state(unwrap(learn.model), state["model"], source)
    check_callback_states(learn, state, source)
    if state["optimizer"] is None:
        return
    if learn.opt is None:
        learn.create_opt()
    saved, own = state["optimizer_type"], type(learn.opt).__name__
    if saved != own:
        raise CheckpointError(
            f"{source} holds {saved} optimizer state but this Learner uses {own}; "
            f"pass opt_func={saved} (or load only the weights with learn.model.load_state_dict)"
        )
    check_param_groups(state["optimizer"], learn.opt, source, _SWAPPED_OPT_HINT)


# A run whose callback swapped learn.opt for its own optimizer, saved before that callback said so.
_SWAPPED_OPT_HINT = (
    " (a callback that swaps learn.opt for its own optimizer returns it from state_dict(), e.g. "
    "{'opt': self.opt}, so the checkpoint stores and restores it there)"
)
