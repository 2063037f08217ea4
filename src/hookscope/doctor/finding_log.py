"""The finding log: which findings the doctor keeps, which it prints, and which it already told.

Findings are deduplicated by (kind, module) — whole-model kinds (:data:`ONCE_PER_RUN`) once per run —
printed once on stderr (unless quiet, at most ``max_print``) and kept in order. A checkpoint keeps the
log, so a resumed run repeats nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hookscope.doctor.findings import Finding

# Whole-model conditions: the first finding says where it starts; later ones would repeat it.
ONCE_PER_RUN = frozenset(
    {
        "exploding_gradient",
        "vanishing_gradient",
        "loss_divergence",
        "nonfinite",
        "nonfinite_validation",
        "oscillating_loss",
        "plateau",
        "overfitting",
    }
)
_SEVERITY_STYLE = {"info": "cyan", "warning": "yellow", "error": "bold red"}


class FindingLog:
    """Findings kept in order, each (kind, module) once; printed unless ``quiet``, at most ``max_print``."""

    def __init__(self, quiet: bool = False, max_print: int = 10) -> None:
        self.quiet, self.max_print = quiet, max_print
        self.findings: list[Finding] = []
        self._seen: set[tuple[str, str]] = set()
        self._printed = 0

    def add(self, found: Iterable[Finding]) -> list[Finding]:
        """Keep (and print, unless quiet) the findings not logged before; returns them."""
        new = []
        for finding in found:
            key = _key(finding)
            if key in self._seen:
                continue
            self._seen.add(key)
            new.append(finding)
        for finding in new:
            self.findings.append(finding)
            if not self.quiet and self._printed < self.max_print:
                self._printed += 1
                print_finding(finding)
        return new

    def is_new(self, finding: Finding) -> bool:
        """Whether :meth:`add` would keep ``finding`` (nothing of its kind and module logged yet)."""
        return _key(finding) not in self._seen

    def describe(self) -> str:
        """Every finding so far, one per line (or a line saying all is well)."""
        if not self.findings:
            return "Doctor: no finding — activations, gradients, updates and the loss look healthy."
        return "\n".join(str(f) for f in self.findings)

    def state_dict(self) -> dict[str, Any]:
        return {
            "findings": [_plain(f.to_dict()) for f in self.findings],
            "seen": [list(key) for key in sorted(self._seen)],
            "printed": self._printed,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.findings = [Finding(**f) for f in state["findings"]]
        self._seen = {(kind, module) for kind, module in state["seen"]}
        self._printed = state["printed"]


def print_finding(finding: Finding) -> None:
    """One finding on stderr, on one line, coloured by severity."""
    from rich.console import Console  # loaded on the first finding, not with hookscope

    style = _SEVERITY_STYLE.get(finding.severity, "")
    console = Console(stderr=True, highlight=False, soft_wrap=True)  # one finding, one line, in any log
    console.print(f"Doctor {finding}", style=style, markup=False)


def _key(finding: Finding) -> tuple[str, str]:
    """What deduplicates findings: the kind, and the module unless the kind is whole-model."""
    return (finding.kind, "" if finding.kind in ONCE_PER_RUN else finding.module)


def _plain(value: Any) -> Any:
    """``value`` with numpy numbers and arrays (rules put them in evidence) as Python numbers and lists,
    which a checkpoint can hold."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return _plain(value.tolist()) if hasattr(value, "tolist") else value
