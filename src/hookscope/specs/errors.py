"""The error type of the specs: a usage error whose one-line message names the spec and the fix."""

from __future__ import annotations


class SpecError(Exception):
    """A model, data or input spec given on the command line cannot be used (a usage error)."""
