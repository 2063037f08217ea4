"""The files of a run folder, read back: its metrics.

The reading side of :mod:`hookscope.run_writer`, below both the callbacks that write a run folder and
``viz``, which builds the report from it, so neither imports the other.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hookscope._deprecation import renamed_keywords

REPORT = "report.html"


@renamed_keywords(folder="path")
def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The rows of ``path/metrics.jsonl`` (empty when the file does not exist)."""
    file = Path(path) / "metrics.jsonl"
    if not file.is_file():
        return []
    return [json.loads(line) for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]

