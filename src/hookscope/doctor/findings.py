"""What the doctor says: a :class:`Finding`, the :class:`Findings` it keeps, and the :class:`Thresholds`
that decide when a rule fires.

They belong to no loop: the Learner's Doctor, ``hs.watch`` and the framework integrations all produce
the same ``Finding`` objects, and ``hs.preflight`` returns them too. In a notebook a finding and a list
of them show as a table (``_repr_html_``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from hookscope.html_table import SEVERITY_COLORS, html_table

SEVERITIES = ("info", "warning", "error")


@dataclass(frozen=True)
class Finding:
    """One diagnosis: ``kind`` (e.g. ``"dead_units"``), the qualified ``module`` name, the training ``step``
    since which it holds, ``severity`` (info/warning/error), a plain-words ``message``, the numbers
    behind it (``evidence``) and, for a cause (``stale_gradients``, ``lr_schedule``...), the symptoms it
    explains: ``explains``, the ``(kind, module)`` of each symptom finding (filled by the finding log,
    :mod:`hookscope.doctor.finding_log`)."""

    kind: str
    module: str
    step: int
    severity: str
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)
    explains: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        # findings.json and checkpoints give lists back: the same finding compares equal after a round trip
        object.__setattr__(self, "explains", tuple((str(k), str(m)) for k, m in self.explains))

    @property
    def key(self) -> tuple[str, str]:
        """``(kind, module)``: how a cause's ``explains`` names this finding."""
        return (self.kind, self.module)

    def to_dict(self) -> dict[str, Any]:
        """Plain containers for findings.json."""
        return asdict(self)

    def __str__(self) -> str:
        return f"[{self.severity}] {self.kind}: {self.message}"

    def _repr_html_(self) -> str:
        """In a notebook: the finding as one table row, then the numbers behind it."""
        evidence = [(key, _shown(value)) for key, value in self.evidence.items()]
        numbers = html_table(("evidence", "value"), evidence) if evidence else ""
        return _findings_table([self]) + numbers


class Findings(list[Finding]):
    """A list of findings (what ``learn.doctor.findings``, ``w.findings`` hold) that a notebook shows as a
    table, most severe first and each symptom under the cause that explains it (:func:`ranked`); the
    list itself keeps the order in which they appeared."""

    def _repr_html_(self) -> str:
        if not self:
            return "<p>Doctor: no finding.</p>"
        return _findings_table(ranked(self))


def _findings_table(findings: list[Finding]) -> str:
    explained = {key for f in findings for key in f.explains}
    rows = [
        (f.severity, f"↳ {f.kind}" if f.key in explained else f.kind, f.module, f.step, f.message)
        for f in findings
    ]
    colors = {i: SEVERITY_COLORS.get(f.severity, "") for i, f in enumerate(findings)}
    caption = f"{len(findings)} finding{'s' if len(findings) != 1 else ''}"
    return html_table(("severity", "kind", "module", "step", "message"), rows, colors=colors, caption=caption)


def _shown(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def ranked(findings: Iterable[Finding]) -> list[Finding]:
    """``findings`` most severe first, then by step, each cause followed by the symptoms it explains: the
    order of findings.json, the report and the command line's list (a severity outside
    :data:`SEVERITIES` ranks as ``info``)."""
    findings = list(findings)
    by_key = {f.key: f for f in findings}
    explained = {key for f in findings for key in f.explains if key in by_key}
    leading = sorted(
        (f for f in findings if f.key not in explained),
        key=lambda f: (-_SEVERITY_RANK.get(f.severity, 0), f.step),
    )
    return [g for f in leading for g in (f, *(by_key[key] for key in f.explains if key in by_key))]


_SEVERITY_RANK = {severity: rank for rank, severity in enumerate(SEVERITIES)}


@dataclass(frozen=True)
class Thresholds:
    """When a rule fires. ``patience``: consecutive recorded steps a condition must hold.

    - ``dead_fraction``: share of a layer's units (channels, dim 1) whose output is exactly 0 for a whole
      batch. Healthy ReLU layers stay well below 0.3.
    - ``saturated_fraction`` of tanh/sigmoid outputs within ``saturation_margin`` of their bounds.
    - ``exploding_norm``: gradient L2 norm of one layer's parameters (healthy models: 1e-3 .. 10), per
      unit of the training loss's start when that is above 1 (a summed loss scales every gradient).
    - ``exploding_growth``: the gradient flowing out of a layer (RMS per value) over the one at the last
      layer (scaled by ``sqrt(fan-out)`` of a last layer wider than its input, a vocabulary head); a
      healthy initialisation keeps it near or below 1.
    - ``vanishing_ratio``: a layer's gradient RMS (per value) below this fraction of the largest layer's.
    - ``update_high`` / ``update_low``: ``||Δw|| / ||w||`` per step of weight matrices (healthy ~1e-3;
      Adam at lr 1e-2 on a small layer gives ~5e-2).
    - ``divergence_factor``: the loss (mean of ``loss_window`` steps) above this multiple of its best
      value so far, and above its starting value.
    - ``stall_window``: steps in each of the two windows the loss rules compare (the last one and the one
      before; each an eighth of the run once the run is longer than 8 windows), ``stall_drop``: the
      least relative fall between them that still counts as falling, ``stall_level``: the recent median
      above this share of the starting loss is "far from its best possible value" (most losses reach
      well below half their start), ``trend_z``: the Mann-Kendall z of the two windows' losses below
      ``-trend_z`` is a significant downward trend (one-sided 5%), so the loss is falling, not stalled,
      however small its fall. Stalled there, the loss is ``oscillating_loss`` when its spread
      ((p90 - p10) / median over the last window) is at least ``oscillation_spread``, else ``plateau``.
      Neither fires on a model that already fits its data at the start (a pretrained one: each batch's
      loss is carried by its few errors): a spread of at least ``fitted_spread`` that was there from
      the first ``loss_window`` losses on (their range at least 1/``noise_growth`` of it) — a bounce
      that training causes grows from a calm start.
    - ``game_divergence_factor``: ``divergence_factor`` when the loss is a game (another optimizer
      trains parameters against it, :mod:`hookscope.doctor.adversaries`): a generator's loss rises
      whenever its discriminator wins, so only a collapse by orders of magnitude is ``loss_divergence``
      (and ``plateau``/``oscillating_loss`` stay silent).
    - ``overfit_epochs``: epochs since the best validation loss; ``overfit_rise``: how far above that
      best the last one is, while the training loss kept falling (``overfitting``).
    """

    patience: int = 3
    dead_fraction: float = 0.5
    saturated_fraction: float = 0.5
    saturation_margin: float = 0.01
    exploding_norm: float = 1e3
    exploding_growth: float = 1e2
    vanishing_ratio: float = 1e-4
    update_high: float = 0.3
    update_low: float = 1e-7
    divergence_factor: float = 4.0
    game_divergence_factor: float = 1e3
    loss_window: int = 3
    stall_window: int = 25
    stall_drop: float = 0.05
    stall_level: float = 0.5
    trend_z: float = 1.645
    oscillation_spread: float = 0.5
    fitted_spread: float = 0.1
    noise_growth: float = 4.0
    overfit_epochs: int = 3
    overfit_rise: float = 0.1
