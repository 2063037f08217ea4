"""The Callback base class and how a set of callbacks is ordered and dispatched.

A callback is a plain class whose methods are named after events (``before_fit``, ``after_loss``, ...);
it reads and writes the loop state through ``self.learn``. Ordering is resolved once per ``fit`` into a
dispatch table that holds, for each event, only the callbacks that define it — so an event nobody
listens to costs a dictionary lookup, not a loop over every callback.

Two general mechanisms keep the Learner free of special cases:

- a callback that needs others beside it lists them in :attr:`Callback.companions`; ``learn.add_cb``
  adds them to the Learner right after it, as callbacks of their own (each placed by its own ``order``,
  keyed by its own name in checkpoints), and ``learn.remove_cb`` removes them with it. Nothing else
  knows about them: the dispatch table, the ordering and the checkpoint see plain callbacks;
- a callback that defines ``wrap_method(event, method)`` sees every other callback's event method when the
  table is built and may return a replacement (``CallbackCost`` times them this way).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from hookscope.train.events import BATCH_EVENTS, EVENTS

if TYPE_CHECKING:
    from hookscope.train.learner import Learner


class Callback:
    """Base class: override any event method; set ``order`` / ``run_before`` / ``run_after``.

    ``run_before`` and ``run_after`` hold a callback class or its name, or a tuple of them (fastai's
    ``run_before = Recorder`` works as written). ``run_train`` /
    ``run_valid`` say whether the batch events of each phase reach this callback. ``rank_zero_only``:
    under torchrun, only rank 0 runs it (what prints or writes files: progress, run folder, trackers).
    ``run_during_sweep = False``: ``Learner.lr_find`` detaches it for its throw-away sweep (what schedules,
    stops, records or diagnoses the real run).
    """

    order: int = 0
    rank_zero_only: bool = False
    run_before: type | str | tuple[type | str, ...] = ()
    run_after: type | str | tuple[type | str, ...] = ()
    run_train: bool = True
    run_valid: bool = True
    run_during_sweep: bool = True
    learn: Learner

    @property
    def name(self) -> str:
        """Snake-case class name without the ``Callback`` suffix: ``GradientClip`` -> ``gradient_clip``."""
        return _snake(type(self).__name__.removesuffix("Callback") or "callback")

    # The key of this callback's state in a checkpoint; None: ``name`` (``.1``, ``.2`` ... for repeats).
    # Set it (on the class or the instance) to keep a checkpoint's key when renaming a class.
    state_key: str | None = None

    @property
    def companions(self) -> list[Callback]:
        """Callbacks this one needs beside it in the Learner (none by default): ``learn.add_cb`` adds them
        right after this one and ``learn.remove_cb`` removes them with it. They are not bound as
        ``learn.<name>``, so a user's own callback of the same class does not clash with them."""
        return []

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must keep to resume this callback exactly: tensors and plain values in dicts and
        lists, and the optimizers and modules it owns, as objects — the checkpoint stores their states and
        gives them back (``train/checkpoint/callback_state.py``)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(order={self.order})"


class CallbackOrderError(ValueError):
    """``run_before`` / ``run_after`` constraints form a cycle."""


def as_callbacks(items: Any) -> list[Callback]:
    """``cbs`` as a list of callback instances; fastai's forms are all accepted: a callback, a Callback
    class (instantiated with no arguments: ``learn.fit(3, cbs=[GradientClip])``), an iterable of them,
    or ``None``. Anything else raises one ``TypeError`` naming it."""
    if items is None:
        return []
    if isinstance(items, Callback | type) or not isinstance(items, Iterable) or isinstance(items, str):
        items = [items]
    return [_as_callback(item) for item in items]


def sort_callbacks(cbs: Iterable[Callback]) -> list[Callback]:
    """Order callbacks by ``order`` (then insertion), moved as little as needed to honour
    ``run_before`` / ``run_after``; a cycle raises :class:`CallbackOrderError` naming the callbacks."""
    pending = sorted(cbs, key=lambda cb: cb.order)
    must_follow = {id(cb): _predecessors(cb, pending) for cb in pending}
    ordered: list[Callback] = []
    while pending:
        ready = next((cb for cb in pending if not must_follow[id(cb)] - {id(c) for c in ordered}), None)
        if ready is None:
            names = ", ".join(type(cb).__name__ for cb in pending)
            raise CallbackOrderError(
                f"run_before/run_after constraints form a cycle among: {names}; remove one of the constraints"
            )
        ordered.append(ready)
        pending.remove(ready)
    return ordered


def dispatch_table(cbs: list[Callback], *, training: bool) -> dict[str, list[Any]]:
    """For each event, the bound methods to call in order; batch events honour run_train/run_valid.

    Every method passes through the ``wrap_method`` of each callback that defines one (in order).
    """
    wrappers = [cb.wrap_method for cb in cbs if hasattr(cb, "wrap_method")]
    table: dict[str, list[Any]] = {}
    for event in EVENTS:
        methods = []
        for cb in cbs:
            method = getattr(cb, event, None)
            if method is None:
                continue
            if event in BATCH_EVENTS and not (cb.run_train if training else cb.run_valid):
                continue
            for wrap in wrappers:
                method = wrap(event, method)
            methods.append(method)
        table[event] = methods
    return table


def _as_callback(item: Any) -> Callback:
    if isinstance(item, Callback):
        return item
    if isinstance(item, type) and issubclass(item, Callback):
        return item()
    raise TypeError(
        f"cbs: {item!r} is not a callback; pass a Callback instance (GradientClip()), a Callback class "
        "(GradientClip, created with no arguments), or a list of them"
    )


def _predecessors(cb: Callback, cbs: list[Callback]) -> set[int]:
    """ids of the callbacks that must run before ``cb``: those it names, and those that name it."""
    before: set[int] = set()
    for other in cbs:
        if other is cb:
            continue
        if _refers_to(cb.run_after, other) or _refers_to(other.run_before, cb):
            before.add(id(other))
    return before


def _refers_to(refs: type | str | tuple[type | str, ...], cb: Callback) -> bool:
    if isinstance(refs, type | str):  # a single reference, as fastai writes ``run_before = Recorder``
        refs = (refs,)
    cls = type(cb)
    return any(
        ref is cls or ref == cls.__name__ or (isinstance(ref, type) and isinstance(cb, ref)) for ref in refs
    )


def _snake(name: str) -> str:
    # An acronym stays one word: LRFinder -> lr_finder, GradientClip -> gradient_clip.
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()
