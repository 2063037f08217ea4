"""Lazy re-exports for the package ``__init__`` modules (PEP 562).

A package lists each public name once, with the module that defines it::

    __getattr__, __dir__ = lazy_exports(__name__, {"Learner": "hookscope.train.learner", ...})

``import hookscope`` then costs no more than its own ``__init__``: the defining module is imported the
first time the name is read (``hs.Learner``, ``from hookscope import Learner``), and the value is kept in
the package's namespace, so later reads are plain attribute lookups. ``submodules`` names the package's
own submodules that are public names themselves (``hs.viz``, ``hs.metrics``). ``deprecated`` maps names
that left the package's namespace to the module that defines them: they are still found, with a
``DeprecationWarning`` at every read, and :func:`dir` no longer lists them.

One case cannot wait: a name defined in the package's submodule *of the same name* (the function
``feature_maps`` of ``hookscope.viz.feature_maps``). Whenever anything imports that submodule, the import
system binds the package attribute ``feature_maps`` to the module object, which a lazy ``__getattr__``
would never see; so such names are imported and bound when the package is, as a plain import would.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from hookscope._deprecation import moved_names


def lazy_exports(
    module_name: str,
    exports: Mapping[str, str],
    submodules: Iterable[str] = (),
    deprecated: Mapping[str, str] | None = None,
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for the package ``module_name`` re-exporting ``exports`` lazily.

    ``exports`` maps each public name to the dotted path of the module that defines it; each name of
    ``submodules`` is the submodule ``module_name.<name>`` itself; ``deprecated`` names, found in their
    module with a warning, are never cached (each read warns).
    """
    sources = dict(exports)
    sources.update({name: f"{module_name}.{name}" for name in submodules})
    submodules = frozenset(submodules)
    moved = moved_names(module_name, deprecated or {}, depth=1)

    def __getattr__(name: str) -> Any:
        source = sources.get(name)
        if source is None:
            return moved(name)  # a deprecated name, else AttributeError
        module = importlib.import_module(source)
        value = module if name in submodules else getattr(module, name)
        vars(sys.modules[module_name])[name] = value  # later reads skip __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[module_name])) | set(sources))

    for name, source in exports.items():
        if source == f"{module_name}.{name}":  # shadowed by its own submodule: bind it now (see above)
            __getattr__(name)
    return __getattr__, __dir__
