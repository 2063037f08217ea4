"""The finding log: which findings the doctor keeps, which it prints, and which it already told.

Findings are deduplicated by (kind, module) — whole-model kinds (:data:`ONCE_PER_RUN`) once per run —
unless a later one is more severe (an ``info`` hint, then the evidence: the training loader does not
shuffle, then the batches' label mix is far off), printed once on stderr (unless quiet, at most
``max_print``) and kept in order. A checkpoint keeps the log, so a resumed run repeats nothing.

Cause before symptom: a mistake in the loop's protocol (:data:`EXPLAINS`: a missing ``zero_grad``, a
collapsed learning-rate schedule, label-sorted data, graphs kept alive) shows in the numbers too — the
loss diverges or oscillates, update ratios fall, the loss plateaus. The log ties each symptom to the
first cause logged in the run whose kind explains it, in either order: the cause's ``explains`` lists
the symptom's ``(kind, module)``, the cause is printed before the symptoms of its check, each symptom as
an indented ``explains:`` line under it. There is no time window: these causes persist once they
appear (nothing clears ``.grad`` at any later step; a collapse is reported only when the rate never
recovered; sorted data stays sorted; kept graphs keep growing), so a symptom logged at any later
check of the run is theirs; one logged before its cause (a collapse is named only once the run is ten
times as long without its length, ``hs.watch``) was printed already, and the cause's line says it
explains it.
``findings`` keeps the order of appearance (a tracker reads it by position); the cause is updated in
place, and :func:`~hookscope.doctor.findings.ranked` puts each cause's symptoms right after it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from hookscope.doctor.findings import SEVERITIES, Finding, Findings

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
# cause kind -> the symptom kinds it explains (memory_growth: the resource rule's kind)
EXPLAINS = {
    "stale_gradients": frozenset({"loss_divergence", "oscillating_loss"}),
    "lr_schedule": frozenset({"update_ratio", "plateau"}),
    "unshuffled_data": frozenset({"oscillating_loss", "plateau"}),
    "graph_kept_alive": frozenset({"memory_growth"}),
}
_SEVERITY_STYLE = {"info": "cyan", "warning": "yellow", "error": "bold red"}


class FindingLog:
    """Findings kept in order, each (kind, module) once; printed unless ``quiet``, at most ``max_print``."""

    def __init__(self, quiet: bool = False, max_print: int = 10) -> None:
        self.quiet, self.max_print = quiet, max_print
        self.findings = Findings()
        self._seen: dict[tuple[str, str], int] = {}  # key -> the highest severity rank logged
        self._printed = 0

    def add(self, found: Iterable[Finding]) -> list[Finding]:
        """Keep (and print, unless quiet) the findings not logged before; returns them."""
        new = []
        for finding in found:
            if not self.is_new(finding):
                continue
            self._seen[_key(finding)] = _rank(finding)
            new.append(finding)
        new.sort(key=lambda f: f.kind not in EXPLAINS)  # causes first, each group in order
        return [self._keep(finding) for finding in new]

    def _keep(self, finding: Finding) -> Finding:
        """Append ``finding``, tied to its cause or (a cause) to the symptoms logged before it; print it."""
        cause = self._cause_of(finding)
        if cause is not None:
            self.findings[cause] = replace(
                self.findings[cause], explains=(*self.findings[cause].explains, finding.key)
            )
            self.findings.append(finding)
            self._print(finding, explained_by=cause)
            return finding
        if finding.kind in EXPLAINS:
            earlier = [f.key for f in self.findings if self._explains(finding, f)]
            finding = replace(finding, explains=tuple(earlier))
        self.findings.append(finding)
        self._print(finding)
        return finding

    def _cause_of(self, symptom: Finding) -> int | None:
        """The index of the first cause logged that explains ``symptom`` (None: no such cause)."""
        return next((i for i, f in enumerate(self.findings) if self._explains(f, symptom)), None)

    def _explains(self, cause: Finding, symptom: Finding) -> bool:
        """Whether ``symptom``'s kind is one ``cause``'s explains and no other cause has claimed it."""
        if symptom.kind not in EXPLAINS.get(cause.kind, ()):
            return False
        return not any(symptom.key in f.explains for f in self.findings)

    def _print(self, finding: Finding, explained_by: int | None = None) -> None:
        """The finding's line; a symptom's indented under its cause (``explained_by``: the cause's index),
        naming the cause when other lines came between them."""
        if self.quiet or self._printed >= self.max_print:
            return
        self._printed += 1
        if explained_by is None:
            print_finding(finding)
            for kind, module in finding.explains:  # symptoms printed before their cause was found
                print_line(f"  explains: {kind}{_where(module)} (above)", finding.severity)
            return
        cause = self.findings[explained_by]
        between = self.findings[explained_by + 1 : -1]
        under = "" if all(f.key in cause.explains for f in between) else f" (under {cause.kind} above)"
        print_line(f"  explains{under}: {finding}", finding.severity)

    def is_new(self, finding: Finding) -> bool:
        """Whether :meth:`add` would keep ``finding`` (nothing of its kind and module logged yet at its
        severity or above)."""
        return _rank(finding) > self._seen.get(_key(finding), -1)

    def describe(self) -> str:
        """Every finding so far, one per line (or a line saying all is well)."""
        if not self.findings:
            return "Doctor: no finding — activations, gradients, updates and the loss look healthy."
        return "\n".join(str(f) for f in self.findings)

    def state_dict(self) -> dict[str, Any]:
        return {
            "findings": [_plain(f.to_dict()) for f in self.findings],
            "seen": [[*key, rank] for key, rank in sorted(self._seen.items())],
            "printed": self._printed,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.findings = Findings(Finding(**f) for f in state["findings"])
        # an older log kept (kind, module) without a rank: logged at any severity
        self._seen = {(seen[0], seen[1]): int(seen[2]) if len(seen) > 2 else 2 for seen in state["seen"]}
        self._printed = state["printed"]


def print_finding(finding: Finding) -> None:
    """One finding on stderr, on one line, coloured by severity."""
    print_line(str(finding), finding.severity)


def print_line(text: str, severity: str) -> None:
    """``Doctor <text>`` on stderr, on one line, coloured by ``severity`` where stderr shows colour."""
    style = _SEVERITY_STYLE.get(severity, "")
    stderr_console(soft_wrap=True).print(f"Doctor {text}", style=style, markup=False)  # one line, any log


def stderr_console(**options: Any) -> Any:
    """A rich ``Console`` on stderr; plain text in a Jupyter kernel, where rich would display HTML whose
    text/plain keeps the ANSI codes (and ipykernel sets ``FORCE_COLOR``)."""
    from rich.console import Console  # loaded on the first message, not with hookscope

    console = Console(stderr=True, highlight=False, **options)
    if console.is_jupyter:
        console = Console(stderr=True, highlight=False, force_jupyter=False, color_system=None, **options)
    return console


def _where(module: str) -> str:
    return f" in `{module}`" if module else ""


def _key(finding: Finding) -> tuple[str, str]:
    """What deduplicates findings: the kind, and the module unless the kind is whole-model."""
    return (finding.kind, "" if finding.kind in ONCE_PER_RUN else finding.module)


def _rank(finding: Finding) -> int:
    return SEVERITIES.index(finding.severity) if finding.severity in SEVERITIES else 0


def _plain(value: Any) -> Any:
    """``value`` with numpy numbers and arrays (rules put them in evidence) as Python numbers and lists,
    which a checkpoint can hold."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return _plain(value.tolist()) if hasattr(value, "tolist") else value
