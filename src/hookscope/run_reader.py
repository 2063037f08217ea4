"""The files of a run folder, read back: its metrics, and :class:`Run`, the folder as an object.

The reading side of :mod:`hookscope.run_writer`, below both the callbacks that write a run folder and
``viz``, which builds the report from it, so neither imports the other. In a notebook a :class:`Run` (and
``learn.run_folder``) shows its status, its findings and its report inline.
"""

from __future__ import annotations

import json
from html import escape
from pathlib import Path
from typing import Any

from hookscope._deprecation import renamed_keywords
from hookscope.doctor.findings import Finding, Findings
from hookscope.staged_folder import CONFIG, read_json

REPORT = "report.html"
REPORT_HEIGHT = 640  # pixels of the report's frame in a notebook (it scrolls inside)


@renamed_keywords(folder="path")
def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The rows of ``path/metrics.jsonl`` (empty when the file does not exist)."""
    file = Path(path) / "metrics.jsonl"
    if not file.is_file():
        return []
    return [json.loads(line) for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]


class Run:
    """A run folder written by ``RunFolder``, ``hookscope train`` or ``hs.watch(..., path=)``, read when
    asked (a run still being written shows what it has so far).

    ``config``, ``metrics`` and ``findings`` are its files' contents; ``report`` the path of its
    ``report.html``. In a notebook it shows as its status and findings, then the report itself.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_dir():
            raise FileNotFoundError(
                f"Run: {self.path} is not a folder; pass a run folder written by hs.callbacks.RunFolder, "
                "hookscope train or hs.watch(..., path=)"
            )

    @property
    def config(self) -> dict[str, Any]:
        """``config.json``: options, command, versions, times and status (empty before it is written)."""
        file = self.path / CONFIG
        return read_json(file) if file.is_file() else {}

    @property
    def metrics(self) -> list[dict[str, Any]]:
        """The rows of ``metrics.jsonl``, per epoch and per step (column ``kind``)."""
        return read_metrics(self.path)

    @property
    def findings(self) -> Findings:
        """The doctor's findings from ``findings.json``, most severe first (empty without a doctor)."""
        file = self.path / "findings.json"
        return Findings(Finding(**f) for f in read_json(file)) if file.is_file() else Findings()

    @property
    def report(self) -> Path:
        """Where ``report.html`` is (or will be, once the fit ends)."""
        return self.path / REPORT

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r}, {self._status()}, {len(self.findings)} findings)"

    def _repr_html_(self) -> str:
        """Status and findings, then ``report.html`` in a frame (its own page, so its style stays its own)."""
        where = f"<code>{escape(self._shown_path())}</code> · {escape(self._status())}"
        header = f"<p><b>hookscope run</b> {where}</p>"
        findings = self.findings._repr_html_() if (self.path / "findings.json").is_file() else ""
        if not self.report.is_file():
            return f"{header}{findings}<p>No report.html yet: it is written when the fit ends.</p>"
        page = escape(self.report.read_text(encoding="utf-8"), quote=True)
        frame = (
            f'<iframe srcdoc="{page}" title="report.html" '
            f'style="width:100%;height:{REPORT_HEIGHT}px;border:1px solid #ccc"></iframe>'
        )
        return f"{header}{findings}{frame}"

    def _shown_path(self) -> str:
        """The folder relative to the working folder when it is inside it (``runs/demo``), else as is."""
        try:
            return str(self.path.resolve().relative_to(Path.cwd().resolve()))
        except ValueError:
            return str(self.path)

    def _status(self) -> str:
        return str(self.config.get("status", "being written"))
