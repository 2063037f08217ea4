"""The doctor's rules: plain functions from host-side statistics to :class:`Finding` objects.

Each rule reads what the recorders of :mod:`hookscope.doctor.recorders` and the engine
(:mod:`hookscope.doctor.engine`, which runs them all in one place) recorded, and says in plain words
what is wrong, where, since which step, and what usually fixes it. The thresholds live in
:class:`Thresholds`; their defaults were chosen so that the healthy reference models (the digits CNN, an
MLP, a ResNet18) stay quiet for a whole epoch while every fault of the catalogue is caught within a few
steps (see docs/doctor.md).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np

from hookscope.doctor.findings import Finding, Thresholds
from hookscope.doctor.record_types import ParamRecord, StepStats


def dead_units(
    history: dict[str, list[StepStats]],
    th: Thresholds,
    producers: dict[str, str | None] | None = None,
    pass_through: Iterable[str] = (),
) -> list[Finding]:
    """Layers whose units output exactly 0 for every example, for ``patience`` recorded steps in a row.

    ``producers`` is the data flow (:mod:`hookscope.doctor.data_flow`: which watched layer produced each
    layer's input; without it, the layer before in model order). Only the head of a chain of dead layers
    is reported (a MaxPool or Flatten after a dead ReLU is dead because of it). The units belong to the
    layer whose output they are: when they are seen at a layer in ``pass_through`` (a Dropout, an
    Identity: they make no units), they are its producer's, seen through the functional ops between
    (``dropout2(F.relu(fc1(x)))``: ``fc1``'s units, seen at ``dropout2``). "Its input comes from" names
    the producer of that layer's input, across pass-through layers.
    """
    names = list(history)
    if not producers:
        producers = {name: names[i - 1] if i else None for i, name in enumerate(names)}
    skip = set(pass_through)
    dead = {
        name: _streak(records, lambda s: s.stats.dead_fraction() >= th.dead_fraction)
        for name, records in history.items()
    }
    dead = {name: streak for name, streak in dead.items() if len(streak) >= th.patience}
    findings: list[Finding] = []
    owners: set[str] = set()
    for name, streak in dead.items():
        if producers.get(name) in dead:
            continue
        owner = _source(name, producers, skip) or name if name in skip else name
        if owner in owners:
            continue
        owners.add(owner)
        findings.append(_dead_finding(owner, name, streak[0].step, history[name][-1].stats, producers, skip))
    return findings


def _dead_finding(
    owner: str, seen: str, since: int, stats: Any, producers: dict[str, str | None], skip: set[str]
) -> Finding:
    fraction = stats.dead_fraction()
    producer = _source(owner, producers, skip)
    where = f"; seen at `{seen}`" if seen != owner else ""
    feed = f"; its input comes from `{producer}`" if producer else ""
    return Finding(
        "dead_units",
        owner,
        since,
        "warning",
        f"layer `{owner}` — {fraction:.0%} of units dead since step {since} (exactly 0 for every "
        f"example{where}{feed}). They pass no gradient, so they never recover on their own. Usual "
        "fixes: lower the learning rate, check the initialisation and biases of the layer "
        "before, use LeakyReLU/GELU, or add normalisation before the activation.",
        {
            "dead_fraction": fraction,
            "channels": int(stats.channel_rms.size),
            "producer": producer,
            "seen_at": seen,
        },
    )


def _source(name: str, producers: dict[str, str | None], skip: set[str]) -> str | None:
    """The layer that produced ``name``'s input, across pass-through layers (a Dropout between)."""
    producer, seen = producers.get(name), {name}
    while producer in skip and producer not in seen:
        seen.add(producer)
        producer = producers.get(producer)
    return producer


def saturation(
    fractions: dict[str, list[tuple[int, float]]], kinds: dict[str, str], th: Thresholds
) -> list[Finding]:
    """tanh/sigmoid layers stuck at their bounds: ``fractions[name]`` is ``(step, saturated share)``."""
    findings: list[Finding] = []
    for name, records in fractions.items():
        streak = _streak(records, lambda r: r[1] >= th.saturated_fraction)
        if len(streak) < th.patience:
            continue
        since, share = streak[0][0], records[-1][1]
        bounds = "-1 or +1" if kinds[name] == "tanh" else "0 or 1"
        findings.append(
            Finding(
                "saturation",
                name,
                since,
                "warning",
                f"layer `{name}` ({kinds[name]}) — {share:.0%} of its outputs are within "
                f"{th.saturation_margin} of {bounds} since step {since}; there the derivative is ~0 and "
                "learning stalls. Usual fixes: normalise or rescale the inputs of the layer, add "
                "BatchNorm/LayerNorm before it, lower the learning rate, or use ReLU-family activations.",
                {"saturated_fraction": share, "activation": kinds[name]},
            )
        )
    return findings


class OutputShapes(NamedTuple):
    """What the layers' outputs looked like on the last recorded step: ``widths``, values per example of
    each layer's output; ``shared``, layers whose output is shared by the batch (first dimension 1)."""

    widths: dict[str, int]
    shared: set[str]


def exploding_gradient(
    layer_norms: dict[str, list[tuple[int, float]]],
    output_grads: dict[str, list[StepStats]],
    th: Thresholds,
    shapes: OutputShapes | None = None,
    losses: Sequence[tuple[int, float]] = (),
) -> list[Finding]:
    """Where gradients blow up, by two signs, each searched from the loss backwards (model order reversed):

    - the gradient flowing out of a layer is ``exploding_growth`` x larger (RMS per value) than at the
      output, for ``patience`` steps: weights that amplify, layer after layer. "At the output" is the
      last layer's output gradient, scaled up by ``sqrt(its output width / the layer before's)`` when
      the last layer is wider than its input (see :func:`_growth`): a head over a 50,257-token
      vocabulary spreads its gradient over 50,257 logits (~1/V per value), and a head that merely
      fans out is no amplifier of the body. Layers whose output is shared by the batch (``shapes.shared``:
      a position embedding's ``(1, T, d)``) are skipped: their gradient is a sum over the batch, larger
      per value by about its square root without anything growing;
    - the gradient norm of a layer's parameters exceeds ``exploding_norm`` per unit of the loss
      (:func:`loss_unit` of the training ``losses``: its start, at least 1): a step far too large. A
      loss multiplied by c (summed over a batch and its pixels instead of averaged, a loss weight)
      multiplies every gradient by c, so an absolute bar would call vae/main.py's summed loss (~7e4 a
      batch, every layer's norm ~1e3..1e4 from step 0) an explosion; measured per unit of the loss's
      own start, its norms are ~0.1. The start, not the loss at that step: a loss that blows up with
      its gradients does not raise the bar with them.
    """
    shapes = shapes or OutputShapes({}, set())
    findings: list[Finding] = []
    growth = {
        n: records for n, records in _growth(output_grads, shapes.widths).items() if n not in shapes.shared
    }
    growing = [
        name
        for name, records in growth.items()
        if len(_streak(records, lambda r: r[1] > th.exploding_growth)) >= th.patience
    ]
    if growing:
        first = growing[-1]
        since = _streak(growth[first], lambda r: r[1] > th.exploding_growth)[0][0]
        factor = growth[first][-1][1]
        findings.append(
            Finding(
                "exploding_gradient",
                first,
                since,
                "warning",
                f"layer `{first}` — the gradient flowing out of it is {factor:.3g}x larger than at the "
                f"output since step {since}: it grows layer after layer on its way back from the loss "
                f"and blows up from here on ({len(growing)} layer(s)). Usual fixes: a smaller "
                "initialisation (kaiming/xavier), normalisation layers, gradient clipping "
                "(hs.callbacks.GradientClip), a lower learning rate.",
                {"growth": factor, "layers": {n: growth[n][-1][1] for n in growing}},
            )
        )
    unit = loss_unit(losses, th)
    bar = th.exploding_norm * unit
    large = [name for name, records in layer_norms.items() if records and records[-1][1] > bar]
    if large:
        first = large[-1]
        since = _streak(layer_norms[first], lambda r: r[1] > bar)[0][0]
        norm = layer_norms[first][-1][1]
        severity = "error" if not math.isfinite(norm) or norm > bar * 1e3 else "warning"
        others = [n for n in large if n != first]
        also = f"; earlier layers too ({', '.join(f'`{n}`' for n in others[:5])})" if others else ""
        per_unit = f" per unit of the loss, which started at {unit:.3g}" if unit > 1.0 else ""
        findings.append(
            Finding(
                "exploding_gradient",
                first,
                since,
                severity,
                f"layer `{first}` — gradient norm of its parameters {norm:.3g} since step {since} (above "
                f"{th.exploding_norm:g}{per_unit}){also}. Usual fixes: a lower learning rate, gradient "
                "clipping (hs.callbacks.GradientClip), normalisation layers.",
                {"grad_norm": norm, "loss_unit": unit, "layers": {n: layer_norms[n][-1][1] for n in large}},
            )
        )
    return findings


def loss_unit(losses: Sequence[tuple[int, float]], th: Thresholds) -> float:
    """The scale of the training loss that gradient norms are judged by: the magnitude of its start (the
    median of its first ``loss_window`` finite values), at least 1 — a loss of the order of a mean (1 and
    below, where ``exploding_norm`` was calibrated) keeps the bar as it is; without losses, 1. Not lower
    for a start below 1: a loss near its floor (a fine-tune; a regression at 1e-4) has gradients far
    larger per unit of it than at the start of training, without anything exploding."""
    start = [v for _, v in losses[: th.loss_window] if math.isfinite(v)]
    return max(1.0, abs(statistics.median(start))) if start else 1.0


def vanishing_gradient(layer_rms: dict[str, list[tuple[int, float]]], th: Thresholds) -> list[Finding]:
    """Layers (reported by the earliest) whose gradient RMS stays below ``vanishing_ratio`` x the largest,
    when the earliest layer of the model that gets any gradient (``layer_rms`` is in model order; exact
    zeros are left to ``dead_units`` and ``no_gradient``) is one of them.

    A gradient that vanishes on its way back reaches every layer before that point too, so the first layer
    is always among them; a layer small on its own is not this fault (the query and key projections of a
    freshly initialised transformer, whose nearly uniform attention passes them ~1e-5 of the largest
    layer's gradient while the layers around them learn).
    """
    steps = min((len(r) for r in layer_rms.values()), default=0)
    if steps < th.patience or len(layer_rms) < 2:
        return []
    recent = range(-th.patience, 0)
    flowing = [name for name, records in layer_rms.items() if all(records[k][1] > 0.0 for k in recent)]
    vanishing = [
        name
        for name in flowing
        if all(layer_rms[name][k][1] < th.vanishing_ratio * _largest(layer_rms, k) for k in recent)
    ]
    if not vanishing or vanishing[0] != flowing[0]:
        return []
    first = vanishing[0]
    since = layer_rms[first][-th.patience][0]
    ratio = layer_rms[first][-1][1] / max(_largest(layer_rms, -1), 1e-300)
    return [
        Finding(
            "vanishing_gradient",
            first,
            since,
            "warning",
            f"layer `{first}` — gradient {ratio:.1e} times the largest layer's since step {since}; "
            f"{len(vanishing)} layer(s) barely learn ({', '.join(f'`{n}`' for n in vanishing[:5])}). "
            "Usual fixes: ReLU-family activations instead of sigmoid/tanh, residual connections, "
            "normalisation layers, a proper initialisation (kaiming/xavier), or a shallower model.",
            {"ratio_to_largest": ratio, "layers": vanishing},
        )
    ]


def no_gradient(params: dict[str, list[ParamRecord]], th: Thresholds) -> list[Finding]:
    """Trainable parameters that never received a gradient (unused or detached branch), per module."""
    missing: dict[str, list[str]] = {}
    for name, records in params.items():
        if len(records) >= th.patience and all(r.grad_norm is None for r in records):
            missing.setdefault(_module_of(name), []).append(name)
    return [
        Finding(
            "no_gradient",
            module,
            params[names[0]][0].step,
            "warning",
            f"`{module}` — trainable parameter(s) {', '.join(f'`{n}`' for n in names)} never received a "
            f"gradient in {len(params[names[0]])} recorded steps: the module is unused, or its output "
            "is detached (.detach(), .item(), numpy, torch.no_grad) before the loss. Usual fixes: connect "
            "it to the loss, or set requires_grad=False / remove it if it is not meant to train.",
            {"parameters": names},
        )
        for module, names in missing.items()
    ]


def update_ratio(params: dict[str, list[ParamRecord]], matrices: set[str], th: Thresholds) -> list[Finding]:
    """Weight matrices whose update-to-weight ratio stays far from ~1e-3 for ``patience`` steps.

    A matrix that starts at zero (LoRA's ``B``, a ViT's position embedding or class token, ControlNet's zero
    convolutions) is all updates: after n like-sized steps from zero each changes it by 1/n of its size (2/n
    under a linear warm-up), whatever the learning rate. Its records from the step that found it at zero
    (a ratio of exactly 1: ``||w_after - 0|| / ||w_after||``) until ``2 / update_high`` steps later are
    left out; after that its ratio means what any matrix's does.
    """
    findings: list[Finding] = []
    grace = math.ceil(2 / th.update_high)
    for name in (n for n in params if n in matrices):
        records = [r for r in params[name] if r.update_ratio is not None and r.grad_norm]
        zero = next((r.step for r in records if abs(r.update_ratio - 1.0) < 1e-6), None)
        if zero is not None:
            records = [r for r in records if not zero <= r.step < zero + grace]
        ratios = [r.update_ratio for r in records]
        if len(ratios) < th.patience:
            continue
        recent = sorted(ratios[-th.patience :])[th.patience // 2]
        if th.update_low <= recent <= th.update_high or not any(ratios):
            continue  # never moved at all: not_updated says why
        too = "large" if recent > th.update_high else "small"
        fix = (
            "lower the learning rate or add warm-up"
            if too == "large"
            else "raise the learning rate, or check that this layer is in the optimizer"
        )
        findings.append(
            Finding(
                "update_ratio",
                _module_of(name),
                records[-th.patience].step,
                "warning",
                f"`{name}` — each step changes it by {recent:.1e} of its size (a healthy rate is about "
                f"1e-3): updates are too {too}. Usual fix: {fix}.",
                {"update_ratio": recent, "parameter": name},
            )
        )
    return findings


def loss_divergence(losses: Sequence[tuple[int, float]], th: Thresholds) -> list[Finding]:
    """The smoothed training loss rose far above its best value, and above where it started by more
    than its batch-to-batch noise explains."""
    scan = DivergenceScan(th.loss_window, th.divergence_factor)
    scan.update(losses)
    return scan.findings()


DIVERGENCE_NOISE = 6.0
"""How many times its batch-to-batch noise the smoothed loss must rise above its start to diverge."""
NOISE_SPAN = 64
"""The recent losses whose changes from one to the next measure the loss's noise."""
NOISE_MIN = 8
"""Changes before the rising window needed to measure the noise; with fewer (a rise in the first steps) the
ratio to the best loss decides alone."""


class DivergenceScan:
    """:func:`loss_divergence` over a stream of losses, reading each loss once.

    Rescanning the whole history at every check made a check cost grow with the run (24 ms at step
    100,000, every 10 steps); the scan keeps the mean of the last ``window`` losses, the first of those
    means (the start) and the best, so a check costs the same at any step and the engine need not keep
    every loss. ``update`` reads the losses that came since its last call; ``findings`` is what
    ``loss_divergence`` says of every loss so far: the first step whose smoothed loss was above
    ``factor`` times the best smoothed loss until then, and above the start by more than ``noise``
    times the loss's batch-to-batch noise, once the history holds two windows, and nothing once a loss
    was not finite (that is the guard's business). A loss whose smoothed value went below zero (a
    policy-gradient surrogate, a WGAN critic, the negative log-likelihood of a density) has no floor that a
    ratio to its best could measure a rise from: the scan says nothing of it from then on, as
    :func:`stalled_loss` says nothing of a start at or below zero.

    The noise is the median change from one loss to the next over the last :data:`NOISE_SPAN` losses before
    the rising window (about the standard deviation of a loss around its level, whatever its trend; the rise
    itself is no noise: a learning rate of 10 on an MLP, losses 2.4, 8.1, 76, 131, 741, counts as noise only
    its first change). A rise in the first steps, with fewer than :data:`NOISE_MIN` changes before it, is
    judged by the ratio to the best alone. A ratio to the best alone is no evidence near zero: a pretrained
    model fine-tuned at lr 1e-5 has losses 0.01..0.4 from batch to batch (a batch's loss is carried by its one
    or two errors), so its smoothed loss swings 4-6x between its luckiest and its unluckiest windows without
    moving at all — measured, a rise of at most 3.1 times its noise; a learning rate 1,000x too high (loss
    2.3, 13.5, 34, 791) rises 12.6 times its noise.
    """

    def __init__(self, window: int, factor: float, noise: float = DIVERGENCE_NOISE) -> None:
        self.window, self.factor, self.noise = window, factor, noise
        self.seen = 0
        self._recent: deque[float] = deque(maxlen=window)
        self._changes: deque[float] = deque(maxlen=NOISE_SPAN)  # |loss - the loss before|
        self._start = self._best = math.inf
        self._finite = True
        # (step, smoothed loss, best until then, batch noise then)
        self._first: tuple[int, float, float, float] | None = None

    def update(self, losses: Iterable[tuple[int, float]]) -> None:
        """Read ``losses``, the ones that came since the last call, oldest first."""
        for step, value in losses:
            self.seen += 1
            self._finite = self._finite and math.isfinite(value)
            if self._recent:
                self._changes.append(abs(value - self._recent[-1]))
            self._recent.append(value)
            if len(self._recent) < self.window or self._first is not None or not self._finite:
                continue
            mean = sum(self._recent) / self.window
            if self._start == math.inf:
                self._start = mean
            self._best = min(self._best, mean)
            if self._best < 0 or mean <= self.factor * self._best:  # below 0: no floor to rise from
                continue
            noise = self._batch_noise()
            if self._rose(mean, noise):
                self._first = (step, mean, self._best, noise or 0.0)

    def _rose(self, mean: float, noise: float | None) -> bool:
        """Above the start by more than the noise explains (with no noise measured yet, the rise to
        ``factor`` x the best, already seen, decides)."""
        return noise is None or mean - self._start > self.noise * noise

    def _batch_noise(self) -> float | None:
        """The median change from one loss to the next over the last ``NOISE_SPAN`` losses before the
        window (None: fewer than ``NOISE_MIN``); read only when the loss rose ``factor`` x its best."""
        before = list(self._changes)[: -self.window]
        return statistics.median(before) if len(before) >= NOISE_MIN else None

    def findings(self) -> list[Finding]:
        if self._first is None or not self._finite or self.seen < 2 * self.window:
            return []
        step, mean, best, noise = self._first
        start = self._start
        rise = f" by {(mean - start) / noise:.0f}x its batch-to-batch noise" if noise > 0 else ""
        return [
            Finding(
                "loss_divergence",
                "",
                step,
                "error",
                f"the training loss diverges — {mean:.3g} at step {step}, {_times(mean, best)} its best "
                f"{best:.3g} and above its start {start:.3g}{rise}. Usual fixes: lower the learning "
                "rate (try hs Learner.lr_find), add warm-up or gradient clipping, check the loss and labels.",
                {"loss": mean, "best": best, "start": start, "noise": noise},
            )
        ]


def _times(value: float, base: float) -> str:
    """``value`` as a multiple of ``base`` in words ("4.2x"; "far above" a best of exactly 0)."""
    return f"{value / base:.1f}x" if base > 0 else "far above"


def stalled_loss(losses: Sequence[tuple[int, float]], th: Thresholds) -> list[Finding]:
    """The loss stopped falling while still far from its best possible value: ``plateau`` when it lies
    flat (or never started to fall), ``oscillating_loss`` when it bounces.

    Compares the median of the last window of steps with the window before (``stall_window`` steps each,
    an eighth of the run once the run is long: slow late progress is still progress) and with the
    starting loss (median of the first ``loss_window`` steps). It stalled only when there is evidence
    against a falling trend: the last window's median is not ``stall_drop`` below the one before, and
    the losses of the two windows show no significant downward trend — Mann-Kendall's test
    (:func:`falling_trend`: S, the sum of the signs of every later-minus-earlier pair, over its standard
    deviation under "no trend", below ``-trend_z``). A rank test, so a loss that falls steadily but
    slowly under batch noise (a small CNN at 2.30 -> 2.28 while its accuracy climbs) is falling however
    small the fall, while flat noise, a bounce between two values and a few loss spikes are not. Batch-
    to-batch noise does not trigger it: a healthy loss keeps falling, and a converged one lies far below
    half its start. On the engine's bounded history (:mod:`hookscope.doctor.loss_history`: every loss of
    the start, an even subsample after it) the windows count kept losses, so they still span an eighth
    of the run, and the messages give their length in steps. It reads the first ``loss_window`` losses
    and the two windows, nothing between (at every check early in a run, so its cost does not grow with
    the history); a non-finite loss among them leaves it silent.
    """
    w = max(th.stall_window, len(losses) // 8)
    if len(losses) < 2 * w:
        return []
    first = [v for _, v in losses[: th.loss_window]]
    windows = [v for _, v in losses[-2 * w :]]
    if not all(map(math.isfinite, first)) or not all(map(math.isfinite, windows)):
        return []
    start = statistics.median(first)
    previous, recent = statistics.median(windows[:w]), statistics.median(windows[w:])
    if start <= 0 or recent < th.stall_level * start or recent < (1 - th.stall_drop) * previous:
        return []
    trend = falling_trend(windows)
    if trend < -th.trend_z:
        return []
    since = losses[-2 * w][0]
    steps = losses[-1][0] - losses[-w][0] + 1  # the last window's length in steps
    ordered = sorted(windows[w:])
    spread = (ordered[(9 * w) // 10 - 1] - ordered[w // 10]) / recent
    if fits_at_start(first, spread, th):
        return []
    evidence = {"start": start, "previous": previous, "recent": recent, "spread": spread, "window": w}
    evidence["trend_z"] = trend
    if spread >= th.oscillation_spread:
        return [
            Finding(
                "oscillating_loss",
                "",
                since,
                "warning",
                f"the training loss bounces instead of falling since step {since}: over the last {steps} "
                f"steps its median is {recent:.3g} ({recent / start:.0%} of its start {start:.3g}) and it "
                f"swings by {spread:.0%} of that (10th to 90th percentile). Usual fixes: lower the learning "
                "rate (try Learner.lr_find) or add warm-up, less momentum, a larger batch, gradient "
                "clipping.",
                evidence,
            )
        ]
    started = recent < (1 - th.stall_drop) * start
    what = f"stopped falling at {recent / start:.0%} of its start" if started else "never started to fall"
    return [
        Finding(
            "plateau",
            "",
            since,
            "warning",
            f"the training loss {what} since step {since}: median {recent:.3g} over the last {steps} "
            f"steps, {previous:.3g} over the {steps} before, {start:.3g} at the start. Usual fixes: a higher "
            "learning rate (try Learner.lr_find), check that the optimizer holds the parameters and that the "
            "activations are not dead or saturated, normalise the inputs, check the labels.",
            evidence,
        )
    ]


def fits_at_start(values: Sequence[float], spread: float, th: Thresholds) -> bool:
    """Whether the model already fitted its data when training started: the loss bounces by at least
    ``fitted_spread`` of its level (``spread``: the last window's (p90 - p10) / median), and it bounced
    about as much from its first ``loss_window`` values on — their range is at least 1/``noise_growth``
    of ``spread`` (the range of three draws is ~2/3 of the 10th-90th percentile spread of the same noise).

    A batch's loss is the mean of its examples' losses, so it spreads by ~``2.6 CV / sqrt(batch size)``
    of its level (CV: the coefficient of variation of the examples' losses). A model yet to learn loses
    about as much on every example (CV well below 1: the digits MLP at lr 1e-6 or with dead ReLUs spreads
    by 1-2%, far under ``fitted_spread``); a model that fits has a loss near 0 on most examples and
    carried by its few errors (CV ~3: finetune_low_lr spreads by 140% at batches of 16, 45% at 256). A
    bounce that training causes (a learning rate too high) grows from a calm start: the catalogue's
    lr 50x too high starts with a range of 6% of its level and bounces by 100%, 18x more. A loss that
    bounced as much from its very first values is a fitted model's batch noise: it has no reason to fall
    to half its start, so a flat or bouncing loss is no evidence of a stall."""
    first = values[: th.loss_window]
    middle = statistics.median(first)
    if middle <= 0 or spread < th.fitted_spread:
        return False
    return (max(first) - min(first)) / middle >= spread / th.noise_growth


def falling_trend(values: Sequence[float]) -> float:
    """Mann-Kendall's trend statistic of ``values`` (in order): ``z = (S -/+ 1) / sqrt(Var S)`` with
    ``S = sum over i < j of sign(values[j] - values[i])`` and ``Var S = n (n - 1) (2n + 5) / 18`` (no
    trend, no ties; the 1 is the continuity correction). About standard normal when the values are noise
    around a level; clearly negative (below -1.645: one-sided 5%) when they fall on the whole, by
    however little. It reads ranks only: a spike counts as one pair sign, not by its size."""
    x = np.asarray(values, dtype=np.float64)
    n = len(x)
    if n < 3:
        return 0.0
    s = float(np.triu(np.sign(x[None, :] - x[:, None]), k=1).sum())
    if s == 0:
        return 0.0
    return (s - math.copysign(1.0, s)) / math.sqrt(n * (n - 1) * (2 * n + 5) / 18)


def not_updated(
    params: dict[str, list[ParamRecord]], groups: dict[str, tuple[int, float]] | None, th: Thresholds
) -> list[Finding]:
    """Parameters that receive gradients but never change, per module, with the cause when the
    optimizer is known: ``groups`` maps each parameter it holds to ``(group index, learning rate)``
    (None: the optimizer is unknown). Steps without a gradient or an update ratio are ignored."""
    stale: dict[str, list[str]] = {}
    since: dict[str, int] = {}
    for name, records in params.items():
        moved = [r for r in records if r.grad_norm and r.update_ratio is not None]
        if len(moved) >= th.patience and not any(r.update_ratio for r in moved):
            module = _module_of(name)
            stale.setdefault(module, []).append(name)
            since[module] = min(since.get(module, moved[0].step), moved[0].step)
    findings = []
    for module, names in stale.items():
        cause, fix = _why_not_updated(names, groups)
        findings.append(
            Finding(
                "not_updated",
                module,
                since[module],
                "warning",
                f"`{module}` — {', '.join(f'`{n}`' for n in names)} received gradients but never changed "
                f"since step {since[module]}: {cause}. Usual fix: {fix}.",
                {"parameters": names, "cause": cause},
            )
        )
    return findings


def _why_not_updated(names: list[str], groups: dict[str, tuple[int, float]] | None) -> tuple[str, str]:
    """The likely cause of a parameter that never changes, in words, and its fix."""
    if groups is not None and any(n not in groups for n in names):
        return (
            "they are not in the optimizer",
            "create the optimizer from model.parameters() after building the whole model (or add a "
            "param group for them)",
        )
    zero = sorted({groups[n][0] for n in names if groups[n][1] == 0.0}) if groups is not None else []
    if zero:
        return (
            f"their param group {', '.join(map(str, zero))} has learning rate 0",
            "give the group a learning rate (check the scheduler and any per-group lr)",
        )
    return (
        "the optimizer step leaves them unchanged",
        "check that opt.step() runs for them (a step skipped every time, a custom optimizer) and that the "
        "learning rate is not so small that the update rounds away",
    )


def overfitting(epochs: Sequence[tuple[int, int, float, float]], th: Thresholds) -> list[Finding]:
    """The validation loss rose for ``overfit_epochs`` epochs past its best (by ``overfit_rise`` of it)
    while the training loss kept falling. ``epochs`` holds ``(epoch, step, train_loss, valid_loss)``."""
    rows = [e for e in epochs if math.isfinite(e[2]) and math.isfinite(e[3])]
    if len(rows) <= th.overfit_epochs:
        return []
    best = min(range(len(rows)), key=lambda i: rows[i][3])
    (epoch, step, train, valid), last = rows[best], rows[-1]
    if (
        len(rows) - 1 - best < th.overfit_epochs
        or last[3] <= (1 + th.overfit_rise) * valid
        or last[2] >= train
    ):
        return []
    return [
        Finding(
            "overfitting",
            "",
            step,
            "warning",
            f"the model overfits since epoch {epoch + 1} (step {step}): the validation loss rose from "
            f"{valid:.3g} to {last[3]:.3g} over {len(rows) - 1 - best} epochs while the training loss fell "
            f"from {train:.3g} to {last[2]:.3g}. Usual fixes: stop at the best epoch (EarlyStopping, or keep "
            "the best checkpoint), more or augmented data, weight decay or dropout, a smaller model.",
            {
                "best_epoch": epoch,
                "valid_losses": [r[3] for r in rows],
                "train_losses": [r[2] for r in rows],
            },
        )
    ]


def frozen(frozen_params: dict[str, int], trainable: int) -> list[Finding]:
    """Modules holding parameters with ``requires_grad=False``: reported once, as information."""
    if not frozen_params:
        return []
    total = sum(frozen_params.values())
    names = ", ".join(f"`{n}`" for n in list(frozen_params)[:5])
    more = f" and {len(frozen_params) - 5} more" if len(frozen_params) > 5 else ""
    return [
        Finding(
            "frozen",
            next(iter(frozen_params)),
            0,
            "info",
            f"{total:,} parameter values are frozen (requires_grad=False) in {names}{more}, next to "
            f"{trainable:,} trainable ones. Fine for fine-tuning a pretrained backbone; if you meant to "
            "train them, set requires_grad=True before creating the optimizer.",
            {"modules": dict(frozen_params), "trainable": trainable},
        )
    ]


def nonfinite(report: Any, step: int, reason: str | None) -> list[Finding]:
    """The NonFiniteGuard's blame as a finding."""
    return [
        Finding(
            "nonfinite",
            report.module or "",
            step,
            "error",
            f"training stopped at step {step}: the {reason or 'value'} became NaN/Inf. {report}",
            {**report.to_dict(), "reason": reason},
        )
    ]


def nonfinite_validation(
    phases: Sequence[tuple[int, int, int]], layers: dict[str, list[StepStats]]
) -> list[Finding]:
    """NaN/Inf on the validation data, at the first validation phase that had any.

    ``phases`` holds ``(step, batches, batches whose loss was NaN/Inf)`` per validation phase; ``layers``
    the per-phase statistics of the watched layers (model order), whose non-finite counts name the first
    layer that output NaN/Inf. Without such a layer the validation loss itself is blamed.
    """
    bad_steps = [step for step, _, bad in phases if bad] + [
        r.step for records in layers.values() for r in records if r.stats.nonfinite
    ]
    if not bad_steps:
        return []
    step = min(bad_steps)
    counts = {name: r.stats.nonfinite for name, records in layers.items() for r in records if r.step == step}
    blamed = next((name for name, n in counts.items() if n), "")
    batches, bad = next(((b, n) for s, b, n in phases if s == step), (0, 0))
    return [
        Finding(
            "nonfinite_validation",
            blamed,
            step,
            "error",
            f"validation at step {step}: {_where_nonfinite(blamed, counts, list(layers), bad, batches)}. "
            "valid_loss is then NaN/Inf: no checkpoint, metric or early stop can rely on it. Usual "
            "causes: NaN/Inf in the validation data (check torch.isfinite(x).all() over it), "
            "preprocessing that differs from training's, or a layer that misbehaves only in eval mode "
            "(BatchNorm running statistics); hs.find_nonfinite(model, batch) names the op.",
            {
                "nonfinite_values": {n: c for n, c in counts.items() if c},
                "loss_nonfinite_batches": bad,
                "batches": batches,
            },
        )
    ]


def _where_nonfinite(blamed: str, counts: dict[str, int], watched: list[str], bad: int, batches: int) -> str:
    """Where the validation NaN/Inf showed first, in words."""
    if not blamed:
        return f"the validation loss was NaN/Inf in {bad} of {batches} batch(es)"
    # The first watched layer sees the data itself: NaN there most likely came in with the inputs.
    inputs = (
        "; it is the first watched layer, so the validation inputs likely hold NaN/Inf"
        if blamed == watched[0]
        else ""
    )
    return f"layer `{blamed}` was the first to output NaN/Inf ({counts[blamed]:,} values){inputs}"


def label_problem(lowest: float, highest: float, batches: int) -> list[Finding]:
    """Class-index targets that were all one class in the ``batches`` seen: nothing to tell apart."""
    if lowest != highest:
        return []
    cls = int(lowest)
    return [
        Finding(
            "label_problem",
            "",
            0,
            "error",
            f"all targets are class {cls} in the {batches} training batch(es) seen: the loss can reach 0 "
            "without learning anything. Check the labels (the target column, the label mapping), and "
            "shuffle a dataset sorted by class (DataLoader(..., shuffle=True)).",
            {"class": cls, "batches": batches},
        )
    ]


def _streak(records: Sequence[Any], condition: Any) -> list[Any]:
    """The longest run of records at the END of ``records`` that satisfy ``condition``."""
    n = 0
    for record in reversed(records):
        if not condition(record):
            break
        n += 1
    return list(records[len(records) - n :])


def _growth(
    output_grads: dict[str, list[StepStats]], widths: dict[str, int] | None = None
) -> dict[str, list[tuple[int, float]]]:
    """Per layer, ``(step, RMS of its output gradient / the yardstick)`` for the common steps.

    The yardstick is the last layer's output-gradient RMS times ``sqrt(w_last / w_before)`` when the
    last layer's output (``widths``: values per example) is wider than the one of the layer before it:
    a layer fanning ``d`` values out to ``V`` passes back, at a unit-gain initialisation, a gradient
    ``sqrt(V / d)`` larger per value, so the head's own fan-out is not counted as growth. A narrower
    head (10 classes from 64 features) is left as it is: its scaling only ever raises the alarm's bar.
    """
    rms = {
        name: {r.step: math.hypot(r.stats.mean, r.stats.std) for r in records if r.stats.finite}
        for name, records in output_grads.items()
    }
    rms = {name: values for name, values in rms.items() if values}
    if len(rms) < 2:
        return {}
    names = list(rms)
    widths = widths or {}
    fan_out = widths.get(names[-1], 0) / max(widths.get(names[-2], 0), 1)
    scale = math.sqrt(max(fan_out, 1.0))
    last = rms[names[-1]]
    return {
        name: [
            (step, v / (last[step] * scale))
            for step, v in sorted(values.items())
            if last.get(step, 0.0) > 0.0
        ]
        for name, values in rms.items()
    }


def _largest(layer_rms: dict[str, list[tuple[int, float]]], k: int) -> float:
    return max(records[k][1] for records in layer_rms.values())


def _module_of(param_name: str) -> str:
    return param_name.rpartition(".")[0]


def layer_gradients(
    params: dict[str, list[ParamRecord]], sizes: dict[str, int]
) -> tuple[dict[str, list[tuple[int, float]]], dict[str, list[tuple[int, float]]]]:
    """Per module (model order): ``(step, gradient L2 norm)`` and ``(step, gradient RMS per value)``, from
    the per-parameter records and the parameters' sizes."""
    squares: dict[str, dict[int, float]] = {}
    counts: dict[str, int] = {}
    for name, records in params.items():
        module = _module_of(name)
        counts[module] = counts.get(module, 0) + sizes.get(name, 1)
        per_step = squares.setdefault(module, {})
        for r in records:
            if r.grad_norm is not None:
                per_step[r.step] = per_step.get(r.step, 0.0) + r.grad_norm**2
    norms = {
        m: [(s, math.sqrt(v)) for s, v in sorted(steps.items())] for m, steps in squares.items() if steps
    }
    rms = {m: [(s, n / math.sqrt(counts[m])) for s, n in records] for m, records in norms.items()}
    return norms, rms
