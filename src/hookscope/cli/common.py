"""What the command handlers share: exit codes, :class:`CommandError` and the one-line error messages.

Imported when a command runs (it imports torch through the error types it recognises), never by
``hookscope --help``.
"""

from __future__ import annotations

import argparse
import re

from hookscope.data.images import ImageReadError
from hookscope.hooks.select import SelectionError
from hookscope.specs import SpecError
from hookscope.staged_folder import RunFolderError, RunFolderWriteError

USAGE_ERROR = 2
RUNTIME_ERROR = 1


class CommandError(Exception):
    """A failure the command reports in one line, with the exit code to use."""

    def __init__(self, message: str, exit_code: int = RUNTIME_ERROR) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _explain(err: Exception) -> tuple[int, str]:
    """Exit code and one-line message for an exception that reached the command."""
    if isinstance(err, CommandError):
        return err.exit_code, _one_line(str(err))
    if isinstance(err, RunFolderWriteError):
        return RUNTIME_ERROR, _one_line(str(err))
    if isinstance(err, SpecError | RunFolderError | SelectionError):
        return USAGE_ERROR, _one_line(str(err))
    if isinstance(err, ImageReadError):
        # Found while training (a file that went bad after the run started): a runtime failure naming it.
        return RUNTIME_ERROR, _one_line(str(err))
    if isinstance(err, OSError) and err.filename:
        return RUNTIME_ERROR, f"cannot access {err.filename}: {err.strerror}; check the path and permissions"
    return RUNTIME_ERROR, _one_line(f"{type(err).__name__}: {err}")


def _options(args: argparse.Namespace) -> dict[str, object]:
    """The parsed options as written to ``config.json`` (without the handler and the bookkeeping)."""
    return {k: v for k, v in vars(args).items() if k not in ("handler", "debug", "command", "command_line")}


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _short_name(model_spec: str) -> str:
    """``hookscope.models:digits_cnn`` -> ``digits_cnn``; ``models/net.py:build`` -> ``build``."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", model_spec.rpartition(":")[2]) or "model"
