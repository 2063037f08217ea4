"""Which modules to listen to: one selection rule shared by every hookscope feature.

A selection is a module type, a tuple of types, a glob over qualified names (``"layer1.*.conv*"``; ``*``
also crosses dots, as in TransformerLens filters), a list of exact names, a predicate
``(name, module) -> bool``, or ``None``. Results always come in model order.

Every hookscope feature names this parameter ``select`` and reads ``None`` the same way: *the
component's default set*, which its docstring names and which is exactly what leaving the argument out
gives. For :func:`select` and :func:`~hookscope.capture` that set is every leaf module.
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Callable, Sequence
from typing import TypeAlias

from torch import nn

from hookscope._deprecation import renamed_keywords

Predicate: TypeAlias = Callable[[str, nn.Module], bool]
Spec: TypeAlias = type | tuple[type, ...] | str | Sequence[str] | Predicate | None


class SelectionError(ValueError):
    """A selection matched no module; the message lists the closest names."""


@renamed_keywords(spec="select")
def select(model: nn.Module, select: Spec = None) -> list[tuple[str, nn.Module]]:
    """Return ``(qualified_name, module)`` pairs of ``model`` matched by ``select``, in model order.

    The root module is a candidate only when it has no children (a bare ``nn.Linear``, named ``""``),
    so ``None`` (every leaf module) and globs mean "the layers inside". A module registered under two
    names is listed once. An empty match raises :class:`SelectionError` naming the closest candidates.
    """
    candidates = _candidates(model)
    matches = [(name, module) for name, module in candidates if _matches(select, name, module)]
    if matches:
        return matches
    raise SelectionError(_no_match_message(model, select, candidates))


def leaves(name: str, module: nn.Module) -> bool:
    """Selection predicate for every leaf module: what :func:`select` takes for ``None``. Pass it where a
    component's default set is smaller (``ActivationStats(select=leaves)`` also watches ReLUs)."""
    return next(module.children(), None) is None


def _candidates(model: nn.Module) -> list[tuple[str, nn.Module]]:
    named = list(model.named_modules())
    if len(named) == 1:
        return named
    return named[1:]


def _matches(spec: Spec, name: str, module: nn.Module) -> bool:
    if spec is None:
        return leaves(name, module)
    if isinstance(spec, type) or (isinstance(spec, tuple) and all(isinstance(t, type) for t in spec)):
        return isinstance(module, spec)
    if isinstance(spec, str):
        return fnmatch.fnmatchcase(name, spec)
    if isinstance(spec, nn.Module):
        # a module is callable, so without this check it would be called as a predicate with (name, module)
        raise TypeError(
            f"selection spec is a module instance ({type(spec).__name__}); pass its qualified name instead, "
            "e.g. 'layer1.0.conv1' (list the names with hs.select(model))"
        )
    if callable(spec):
        return bool(spec(name, module))
    if isinstance(spec, Sequence) and all(isinstance(s, str) for s in spec):
        return name in spec
    raise TypeError(
        f"unsupported selection spec {spec!r} ({type(spec).__name__}); use a module type, a tuple of "
        "types, a glob such as 'layer1.*.conv*', a list of names, a predicate (name, module) -> bool, "
        "or None for all leaf modules"
    )


def _no_match_message(model: nn.Module, spec: Spec, candidates: list[tuple[str, nn.Module]]) -> str:
    where = type(model).__name__
    if isinstance(spec, type | tuple):
        present = sorted({type(m).__name__ for _, m in candidates})
        return (
            f"no module of {where} is an instance of {_type_names(spec)}; module types present: "
            f"{', '.join(present[:12])}"
        )
    names = [name for name, _ in candidates]
    wanted = [spec] if isinstance(spec, str) else list(spec) if isinstance(spec, Sequence) else []
    if isinstance(spec, Sequence) and not isinstance(spec, str):
        missing = [w for w in wanted if w not in names]
        wanted = missing or wanted
    closest = _closest(wanted, names)
    hint = f"; closest names: {', '.join(closest)}" if closest else ""
    return f"selection {spec!r} matches no module of {where}{hint} (list all with hs.select(model))"


def _closest(wanted: list[str], names: list[str]) -> list[str]:
    found: list[str] = []
    for w in wanted:
        pattern = w.replace("*", "").replace("?", "")
        for name in difflib.get_close_matches(pattern, names, n=5, cutoff=0.4):
            if name not in found:
                found.append(name)
    return found[:5]


def _type_names(spec: type | tuple[type, ...]) -> str:
    types = spec if isinstance(spec, tuple) else (spec,)
    return " | ".join(t.__name__ for t in types)
