"""Saving and loading a Learner's full state: model, pending gradients, optimizer, callbacks, RNGs, position.

Callbacks carry the rest of the run (recorder history, schedulers, the grad scaler, ...) through their
``state_dict``, so this module knows no callback by name. Loading checks that model and optimizer fit
before anything is changed, so a refused load leaves the Learner as it was.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from hookscope.train import distributed
from hookscope.train.callback import flatten
from hookscope.train.checkpoint.file import CheckpointError, check_plain, load_checkpoint, write_checkpoint
from hookscope.train.checkpoint.rng import capture_rng, rank_states, rng_generators
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


def save_learner(learn: Learner, path: str | os.PathLike[str], position: Position | None = None) -> Path:
    """Write the full state of ``learn`` to ``path`` atomically: model, pending gradients (mid
    accumulation), optimizer, every callback's ``state_dict`` (recorder history, schedulers, grad scaler,
    ...), every RNG, and the loop position.

    Under torchrun every rank calls this together (callback states and RNGs are gathered), rank 0 writes
    the file, and the others wait at a barrier until it is written."""
    position = position or current_position(learn)
    opt = learn.opt
    state = {
        "model": unwrap(learn.model).state_dict(),
        "grads": _grads(learn.model),
        "optimizer": opt.state_dict() if opt is not None else None,
        "optimizer_type": type(opt).__name__ if opt is not None else None,
        "callbacks": _callback_states(learn),
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
    load_optimizer(learn, state)
    return state


def load_model_and_callbacks(learn: Learner, state: Mapping[str, Any], source: str) -> None:
    """Check that ``state`` fits ``learn``, then load the model, its pending gradients and the callbacks'
    states: everything but the optimizer, which a resumed fit loads only once ``before_fit`` has built
    the schedulers (so the saved learning rates win)."""
    _check_fits(learn, state, source)
    unwrap(learn.model).load_state_dict(state["model"])
    _load_grads(learn.model, state["grads"])
    _load_callback_states(learn, state["callbacks"], source)


def load_optimizer(learn: Learner, state: Mapping[str, Any]) -> None:
    """Load the optimizer state, when the checkpoint has one (a Learner saved before any fit has none)."""
    if state["optimizer"] is not None:
        learn.opt.load_state_dict(state["optimizer"])


def _grads(model: nn.Module) -> dict[str, torch.Tensor]:
    """Gradients not yet consumed by a step (mid gradient-accumulation); empty after ``zero_grad``."""
    return {name: p.grad for name, p in unwrap(model).named_parameters() if p.grad is not None}


def _load_grads(model: nn.Module, grads: Mapping[str, torch.Tensor]) -> None:
    for name, param in unwrap(model).named_parameters():
        param.grad = grads[name].to(param.device, param.dtype) if name in grads else None


def _check_fits(learn: Learner, state: Mapping[str, Any], source: str) -> None:
    """Refuse, before anything is changed, a checkpoint whose model or optimizer does not fit ``learn``."""
    check_model_state(unwrap(learn.model), state["model"], source)
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
    saved_groups = [len(group["params"]) for group in state["optimizer"]["param_groups"]]
    own_groups = [len(group["params"]) for group in learn.opt.param_groups]
    if saved_groups != own_groups:
        raise CheckpointError(
            f"{source}: parameter groups of {saved_groups} parameters in the file vs {own_groups} in this "
            "optimizer; build the optimizer with the same parameter groups as the saved run"
        )


def _callback_states(learn: Learner) -> dict[str, Any]:
    states: dict[str, Any] = {}
    for key, cb in _keyed_callbacks(learn):
        state = cb.state_dict()
        check_plain(state, f"{type(cb).__name__}.state_dict()")
        if state:
            states[key] = state
    return states


def _load_callback_states(learn: Learner, states: Mapping[str, Any], source: str) -> None:
    callbacks = dict(_keyed_callbacks(learn))
    absent = [key for key in states if key not in callbacks]
    if absent:
        warnings.warn(
            f"{source} holds state for callbacks {absent} that this Learner does not have; "
            "that state is ignored, so the resumed run can differ from the original",
            stacklevel=5,  # the user's learn.load(...) or learn.fit(..., resume=...)
        )
    for key, state in states.items():
        if key in callbacks:
            callbacks[key].load_state_dict(state)


def _keyed_callbacks(learn: Learner) -> list[tuple[str, Any]]:
    """Callbacks, the parts of composite ones included, keyed by ``cb.name``; a repeated name gets
    ``.1``, ``.2`` ... in the order of ``flatten(learn.cbs)``."""
    keyed: list[tuple[str, Any]] = []
    seen: dict[str, int] = {}
    for cb in flatten(learn.cbs):
        count = seen.get(cb.name, 0)
        seen[cb.name] = count + 1
        keyed.append((cb.name if count == 0 else f"{cb.name}.{count}", cb))
    return keyed
