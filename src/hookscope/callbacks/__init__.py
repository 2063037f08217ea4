"""Built-in callbacks, one file per family."""

from hookscope.callbacks.progress import ProgressBar
from hookscope.callbacks.recorder import Recorder

__all__ = ["ProgressBar", "Recorder"]
