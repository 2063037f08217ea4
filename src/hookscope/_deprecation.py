"""Old names that keep working for one release, with a ``DeprecationWarning`` naming the new one.

Two kinds of rename, each in one line where it happens:

- a keyword: ``@renamed_keywords(spec="select")`` on the function (or ``__init__``) that took ``spec=``;
- a name that moved to another module: ``__getattr__ = moved_names(__name__, {"save_figure":
  "hookscope.viz.save"})`` in the module it left (PEP 562: the module's own names are found first).

``tests/test_compat.py`` checks every alias: it warns once per use and still works.
"""

from __future__ import annotations

import functools
import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def deprecated(message: str, stacklevel: int = 3) -> None:
    """Warn, by default, the caller of the function that calls this one."""
    warnings.warn(message, DeprecationWarning, stacklevel=stacklevel)


def renamed_keywords(**renames: str) -> Callable[[F], F]:
    """Accept each old keyword (``old="new"``) as the new one, with a DeprecationWarning; passing both is a
    TypeError. Positional calls are untouched. The wrapper's ``renamed_keywords`` holds ``renames`` for
    code that checks keywords against the signature (which shows the new names only)."""

    def decorate(func: F) -> F:
        where = func.__qualname__.removesuffix(".__init__")

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for old, new in renames.items():
                if old not in kwargs:
                    continue
                if new in kwargs:
                    raise TypeError(f"{where}: {old}= and {new}= both given; pass {new}= only")
                deprecated(f"{where}: {old}= is now {new}=; the old keyword goes in the next release")
                kwargs[new] = kwargs.pop(old)
            return func(*args, **kwargs)

        wrapper.renamed_keywords = dict(renames)  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate


def moved_names(module_name: str, moves: Mapping[str, str], depth: int = 0) -> Callable[[str], Any]:
    """A module ``__getattr__`` that finds each name of ``moves`` in its new module (``name ->
    "dotted.module"``), with a DeprecationWarning at every read. ``depth``: how many functions stand
    between it and the reader (1 when another ``__getattr__`` calls it)."""

    def __getattr__(name: str) -> Any:
        home = moves.get(name)
        if home is None:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        message = f"{module_name}.{name} moved to {home}.{name}; the old path goes in the next release"
        deprecated(message, stacklevel=3 + depth)
        return getattr(importlib.import_module(home), name)

    return __getattr__
