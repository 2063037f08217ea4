"""The Recorder moved beside the loop, to :mod:`hookscope.train.recorder` (the Learner adds it by default and
``Learner.validate`` reads what it measures). ``hs.callbacks.Recorder`` stays its name in the catalogue; this
module path keeps working for a release, with a DeprecationWarning."""

from __future__ import annotations

import warnings
from typing import Any


def __getattr__(name: str) -> Any:
    if name != "Recorder":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        "hookscope.callbacks.recorder.Recorder moved to hookscope.train.recorder; import it as "
        "hs.callbacks.Recorder (or from hookscope.train.recorder)",
        DeprecationWarning,
        stacklevel=2,
    )
    from hookscope.train.recorder import Recorder

    return Recorder
