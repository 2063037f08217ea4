"""What callbacks own, in a checkpoint: their ``state_dict``, including the optimizers and modules in it.

A callback's ``state_dict()`` returns plain values and tensors (nested in dicts, lists and tuples) and may
hold live objects that have a state of their own — an optimizer, a module, a scheduler, a grad scaler.
Each such object is stored as ``{OBJECT: class name, "state": object.state_dict()}`` and, on load, given
back to the object at the same place in the fresh callback's ``state_dict()``: at once when the callback
has built it (in ``__init__``, or in its ``load_state_dict``), else when the callback has — by the start
of the first training phase (``before_fit`` / ``before_train``), just before the first batch. The
callback's ``load_state_dict`` receives the saved state with each object replaced by its saved state.

When ``learn.opt`` is such an object (a callback swapped its own optimizer in, as article 004's CycleGAN
trainer does), the checkpoint names that callback as the optimizer's owner instead of saving the
optimizer twice, and a fresh Learner does not compare it with its own default optimizer.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from hookscope.train.callback import Callback
from hookscope.train.checkpoint.file import CheckpointError, check_plain
from hookscope.train.checkpoint.weights import check_model_state

if TYPE_CHECKING:
    from hookscope.train.learner import Learner

OBJECT = "hookscope.object"  # the key that marks a stored object's state inside a callback state


@dataclass
class PendingObject:
    """A saved object state whose object the callback has not built yet."""

    callback: Callback
    path: tuple[Any, ...]
    saved: Mapping[str, Any]
    source: str


def save_callback_states(learn: Learner) -> dict[str, Any]:
    """The checkpoint entries for the callbacks: ``callbacks`` (each callback's stored state by key),
    ``callback_classes`` (their class names, for messages) and ``optimizer_owner`` (where ``learn.opt``
    is stored when a callback owns it, else None)."""
    states: dict[str, Any] = {}
    classes: dict[str, str] = {}
    owner = None
    for key, cb in keyed_callbacks(learn):
        live = cb.state_dict()
        state = _with_pending(_stored(live), [item for item in learn.pending_objects if item.callback is cb])
        check_plain(state, f"{type(cb).__name__}.state_dict()")
        if not state:
            continue
        states[key], classes[key] = state, type(cb).__name__
        path = _path_of(live, learn.opt) if learn.opt is not None else None
        if path is not None:
            owner = {"callback": key, "path": list(path)}
    return {"callbacks": states, "callback_classes": classes, "optimizer_owner": owner}


def check_callback_states(learn: Learner, state: Mapping[str, Any], source: str) -> None:
    """Refuse, before anything is loaded, a missing callback that owns objects (or ``learn.opt``) and an
    object the fresh callback already built that does not fit its saved state."""
    callbacks = dict(keyed_callbacks(learn))
    classes = state.get("callback_classes", {})
    for key, saved in state["callbacks"].items():
        cb = callbacks.get(key)
        if cb is None:
            _refuse_missing(key, classes.get(key, key), saved, state.get("optimizer_owner"), source)
            continue
        objects = list(_objects(saved))
        current = cb.state_dict() if objects else {}
        for path, saved_object in objects:
            live = _at(current, path)
            if live is not None:
                check_object(live, saved_object, f"{source}: {type(cb).__name__}.state_dict(){_show(path)}")


def load_callback_states(learn: Learner, states: Mapping[str, Any], source: str) -> None:
    """Give each callback its saved state, then its objects theirs (now, or pending until built)."""
    callbacks = dict(keyed_callbacks(learn))
    absent = [key for key in states if key not in callbacks]
    if absent:
        warnings.warn(
            f"{source} holds state for callbacks {absent} that this Learner does not have; "
            "that state is ignored, so the resumed run can differ from the original",
            stacklevel=5,  # the user's learn.load(...) or learn.fit(..., resume=...)
        )
    learn.pending_objects = []
    for key, saved in states.items():
        cb = callbacks.get(key)
        if cb is None:
            continue
        cb.load_state_dict(_plain(saved))
        for path, saved_object in _objects(saved):
            pending = PendingObject(cb, path, saved_object, source)
            if not _load_pending(pending, required=False):
                learn.pending_objects.append(pending)


def load_pending_objects(learn: Learner) -> None:
    """Load the saved states whose objects the callbacks have built since the checkpoint was read; one
    still missing is a :class:`CheckpointError` naming the callback and where to build it."""
    pending, learn.pending_objects = learn.pending_objects, []
    for item in pending:
        _load_pending(item, required=True)


def check_object(live: Any, saved: Mapping[str, Any], where: str) -> None:
    """Refuse ``saved`` (a stored object) for ``live`` in one line: another class, other parameter groups
    (an optimizer), other keys or shapes (a module)."""
    if type(live).__name__ != saved[OBJECT]:
        raise CheckpointError(
            f"{where} holds {saved[OBJECT]} state but this run built a {type(live).__name__}; build the "
            "same class as the saved run"
        )
    if isinstance(live, torch.optim.Optimizer):
        check_param_groups(saved["state"], live, where)
    elif isinstance(live, nn.Module):
        check_model_state(live, saved["state"], where)


def check_param_groups(
    saved: Mapping[str, Any], opt: torch.optim.Optimizer, where: str, hint: str = ""
) -> None:
    """Refuse an optimizer state whose parameter groups differ in number or size from ``opt``'s."""
    saved_groups = [len(group["params"]) for group in saved["param_groups"]]
    own_groups = [len(group["params"]) for group in opt.param_groups]
    if saved_groups != own_groups:
        raise CheckpointError(
            f"{where}: parameter groups of {saved_groups} parameters in the file vs {own_groups} in this "
            f"optimizer; build the optimizer with the same parameter groups as the saved run{hint}"
        )


def keyed_callbacks(learn: Learner) -> list[tuple[str, Any]]:
    """Callbacks keyed by their ``state_key`` (``cb.name`` unless set); a repeated key gets ``.1``,
    ``.2`` ... in the order of ``learn.cbs``."""
    keyed: list[tuple[str, Any]] = []
    seen: dict[str, int] = {}
    for cb in learn.cbs:
        key = cb.state_key or cb.name
        count = seen.get(key, 0)
        seen[key] = count + 1
        keyed.append((key if count == 0 else f"{key}.{count}", cb))
    return keyed


# ---- helpers -----------------------------------------------------------------------------------------


def _load_pending(item: PendingObject, required: bool) -> bool:
    """Load ``item`` into its object if the callback has built it; False when not built and not
    ``required``."""
    name = type(item.callback).__name__
    where = f"{item.source}: {name}.state_dict(){_show(item.path)}"
    live = _at(item.callback.state_dict(), item.path)
    if live is None:
        if not required:
            return False
        raise CheckpointError(
            f"{where} holds {item.saved[OBJECT]} state, but {name} had not built that object when training "
            "started; build it in __init__, load_state_dict, before_fit or before_train"
        )
    check_object(live, item.saved, where)
    live.load_state_dict(item.saved["state"])
    return True


def _with_pending(state: Any, pending: list[PendingObject]) -> Any:
    """``state`` with each object still waiting to be built replaced by the state it waits for, so that a
    save between a load and the first batch loses nothing."""
    for item in pending:
        *parents, last = item.path
        container = _at(state, tuple(parents))
        if isinstance(container, dict | list) and _at(container, (last,)) is None:
            container[last] = item.saved
    return state


def _refuse_missing(key: str, cls: str, saved: Any, owner: Mapping[str, Any] | None, source: str) -> None:
    """A missing callback that owned objects (or ``learn.opt``) is an error; plain state only warns."""
    owns_opt = owner is not None and owner["callback"] == key
    paths = [_show(path) for path, _ in _objects(saved)]
    if not (owns_opt or paths):
        return
    what = "learn.opt and " if owns_opt else ""
    raise CheckpointError(
        f"{source} holds {what}the state of {cls}.state_dict(){', '.join(paths)}, but this Learner has no "
        f"callback {key!r}; add {cls}() to cbs as the saved run had it"
    )


def _stored(value: Any) -> Any:
    """``value`` with every object that has a state replaced by ``{OBJECT: class, "state": ...}``."""
    if _is_object(value):
        return {OBJECT: type(value).__name__, "state": _stored(value.state_dict())}
    if type(value) in (dict, OrderedDict):  # other mappings are left for check_plain to refuse
        return type(value)((k, _stored(v)) for k, v in value.items())
    if type(value) in (list, tuple):
        return type(value)(_stored(v) for v in value)
    return value


def _plain(value: Any) -> Any:
    """A stored state with each stored object replaced by its saved state (what ``load_state_dict`` gets)."""
    if _is_stored_object(value):
        return _plain(value["state"])
    if type(value) in (dict, OrderedDict):
        return type(value)((k, _plain(v)) for k, v in value.items())
    if type(value) in (list, tuple):
        return type(value)(_plain(v) for v in value)
    return value


def _objects(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Mapping[str, Any]]]:
    """``(path, stored object)`` for every stored object in a stored state."""
    if _is_stored_object(value):
        yield path, value
        return
    for k, v in _children(value):
        yield from _objects(v, (*path, k))


def _path_of(value: Any, target: object, path: tuple[Any, ...] = ()) -> tuple[Any, ...] | None:
    """Where ``target`` (by identity) sits in a live callback state, or None."""
    if value is target:
        return path
    for k, v in _children(value):
        found = _path_of(v, target, (*path, k))
        if found is not None:
            return found
    return None


def _children(value: Any) -> Iterable[tuple[Any, Any]]:
    """``(key or index, item)`` of a dict, list or tuple; nothing for any other value."""
    if isinstance(value, Mapping):
        return value.items()
    if type(value) in (list, tuple):
        return enumerate(value)
    return ()


def _at(value: Any, path: tuple[Any, ...]) -> Any:
    """The value at ``path`` in a live callback state, or None where the path does not lead anywhere."""
    for step in path:
        try:
            value = value[step]
        except (KeyError, IndexError, TypeError):
            return None
    return value


def _is_object(value: Any) -> bool:
    return (
        not isinstance(value, torch.Tensor | Mapping)
        and callable(getattr(value, "state_dict", None))
        and callable(getattr(value, "load_state_dict", None))
    )


def _is_stored_object(value: Any) -> bool:
    return isinstance(value, Mapping) and OBJECT in value


def _show(path: tuple[Any, ...]) -> str:
    return "".join(f"[{step!r}]" for step in path)
