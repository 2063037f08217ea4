"""Preflight: the checks a careful practitioner runs before training, in seconds, on a copy of the model.

They follow Karpathy's "A Recipe for Training Neural Networks" (verify the loss at initialisation, overfit
one batch, check that samples do not mix, look at the data's scale) and the program checks of UMLAUT and
DeepDiagnosis (inputs not normalised, an output activation the loss applies again, outputs that cannot
reach the targets). Each check returns :class:`~hookscope.doctor.findings.Finding` objects of one kind:
``label_problem``, ``output_loss_mismatch``, ``input_scale``, ``batch_mixing``, ``init_loss`` and
``cannot_overfit``.

Nothing the user holds changes: the checks run on a deep copy of the model (so its parameters and its
BatchNorm running statistics stay as they were), and torch's, numpy's and Python's random states, as well
as the data loader's own generator, are restored afterwards. Inside, the CPU generator is seeded, so the
same model and data give the same findings.
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from hookscope.doctor.findings import Finding
from hookscope.hooks.handles import HookSet
from hookscope.hooks.tensors import first_tensor, map_tensors, model_device, tensors_in

# What the data checks look at: the first batches, up to this many samples.
SAMPLE_BATCHES, SAMPLE_SIZE = 4, 512
# init_loss: the loss at initialisation above this multiple of what chance gives.
INIT_LOSS_FACTOR = {"classification": 2.0, "regression": 3.0}
# input_scale: the inputs' RMS above LARGE_RMS or every value below TINY_MAX; one feature's (channel's)
# RMS above FEATURE_RATIO times the median feature's.
# Only features non-zero in at least DENSE_FRACTION of the values count towards the median.
LARGE_RMS, TINY_MAX, FEATURE_RATIO, DENSE_FRACTION = 10.0, 1e-2, 100.0, 0.1
# label_problem "one class only" needs at least this many targets (2 balanced classes: chance 2^-15).
MIN_LABELS_ONE_CLASS = 16
# cannot_overfit: OVERFIT_SAMPLES samples, at most OVERFIT_STEPS steps, must bring the loss below
# OVERFIT_FRACTION of chance (above the loss's own floor, e.g. with label smoothing).
OVERFIT_SAMPLES, OVERFIT_STEPS, OVERFIT_FRACTION, OVERFIT_LR = 16, 300, 0.1, 1e-3
# A loss that missed the goal but fell below OVERFIT_PROGRESS of its start learns slowly (a warning);
# one that did not, or went non-finite, points to a bug (an error).
OVERFIT_PROGRESS = 0.5
# batch_mixing: sample counts tried for the probe batch (one that no other dimension of the data has),
# and at most this many mixing modules traced back from the output (one backward pass each).
MIXING_SIZES, MIXING_ROUNDS = (3, 5, 7, 11, 13), 6

_LOSS_KINDS: dict[Any, str] = {
    nn.CrossEntropyLoss: "multiclass",
    F.cross_entropy: "multiclass",
    nn.NLLLoss: "nll",
    F.nll_loss: "nll",
    nn.BCEWithLogitsLoss: "binary_logits",
    F.binary_cross_entropy_with_logits: "binary_logits",
    nn.BCELoss: "binary_probs",
    F.binary_cross_entropy: "binary_probs",
    nn.MSELoss: "mse",
    F.mse_loss: "mse",
    nn.L1Loss: "l1",
    F.l1_loss: "l1",
    nn.SmoothL1Loss: "regression",
    F.smooth_l1_loss: "regression",
    nn.HuberLoss: "regression",
    F.huber_loss: "regression",
}
_CLASSIFICATION = ("multiclass", "nll", "binary_logits", "binary_probs")
_REGRESSION = ("mse", "l1", "regression")
# Output activations whose values are bounded, and the bounds: by module type (nn.Hardtanh and its
# subclass nn.ReLU6 read their own), and by the autograd node of the output (torch.sigmoid in a forward).
_BOUNDED = {
    nn.Sigmoid: (0.0, 1.0),
    nn.Hardsigmoid: (0.0, 1.0),
    nn.Tanh: (-1.0, 1.0),
    nn.Softsign: (-1.0, 1.0),
}
_BOUNDED_OPS = {
    "SigmoidBackward0": (0.0, 1.0),
    "HardsigmoidBackward0": (0.0, 1.0),
    "TanhBackward0": (-1.0, 1.0),
}
_BATCH_NORMS = (
    nn.BatchNorm1d,
    nn.BatchNorm2d,
    nn.BatchNorm3d,
    nn.SyncBatchNorm,
    nn.LazyBatchNorm1d,
    nn.LazyBatchNorm2d,
    nn.LazyBatchNorm3d,
)
_SEQUENCE_FIRST = (nn.RNNBase, nn.MultiheadAttention, nn.Transformer, nn.TransformerEncoder)
_SEQUENCE_FIRST += (nn.TransformerDecoder, nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)


def preflight(
    model: nn.Module,
    data: Any,
    loss_func: Callable[..., torch.Tensor],
    *,
    opt_func: Callable[..., torch.optim.Optimizer] | None = None,
    lr: float | None = None,
    steps: int | None = None,
) -> list[Finding]:
    """Check ``model``, ``data`` and ``loss_func`` before training; return the problems found.

    ``data`` is a DataLoader, an ``hs.DataLoaders`` or ``(train, valid)`` pair (the training loader is
    used) or one ``(inputs, targets)`` batch. The overfitting check trains a copy for at most ``steps``
    steps (default 300) with ``opt_func`` (default Adam) at ``lr`` (default 1e-3). The model, its
    BatchNorm statistics and every random generator are left as they were.
    """
    steps = OVERFIT_STEPS if steps is None else steps
    lr = OVERFIT_LR if lr is None else lr
    if steps < 1:
        raise ValueError(f"preflight: steps={steps}; pass steps >= 1 (the overfitting check's budget)")
    loader = training_loader(data, "preflight")
    with _random_state_kept(loader):
        torch.default_generator.manual_seed(0)
        batches = list(islice(iter(loader), SAMPLE_BATCHES))
        if not batches:
            raise ValueError(
                "preflight: the training data yields no batch; pass data with at least one batch"
            )
        device = model_device(model)
        inputs, target = _split(map_tensors(lambda t: t.to(device), batches[0]))
        net = copy.deepcopy(model).train()
        return _check(net, inputs, target, batches, loss_func, opt_func, lr, steps)


def training_loader(data: Any, caller: str) -> Any:
    """The training batches in ``data``: a DataLoader (any iterable with a length), the ``train`` loader
    of an ``hs.DataLoaders`` or a ``(train, valid)`` pair, or one ``(inputs, targets)`` batch as a list."""
    if hasattr(data, "train") and hasattr(data, "valid"):
        return data.train
    if isinstance(data, tuple | list) and len(data) == 2 and all(isinstance(d, torch.Tensor) for d in data):
        return [tuple(data)]
    if isinstance(data, tuple | list) and len(data) == 2 and hasattr(data[0], "__iter__"):
        return data[0]
    if hasattr(data, "__iter__") and hasattr(data, "__len__"):
        return data
    raise TypeError(
        f"{caller}: data of type {type(data).__name__} is not a DataLoader, a (train, valid) pair or an "
        "(inputs, targets) batch; pass one of these"
    )


# ---- the checks, in the order they run ------------------------------------------------------------------


@dataclass
class _Probe:
    """One training-mode forward of the copy: the output, the first and last leaf modules that ran, and
    whether the last one's output is the model's output (nothing applied after it)."""

    output: Any
    first: str = ""
    last: str = ""
    last_module: nn.Module | None = None
    last_is_output: bool = False
    last_weighted: str = ""
    final_op: str = ""
    names: dict[int, str] = field(default_factory=dict)


def _check(
    net: nn.Module,
    inputs: tuple,
    target: Any,
    batches: list,
    loss_func: Callable[..., torch.Tensor],
    opt_func: Callable[..., torch.optim.Optimizer] | None,
    lr: float,
    steps: int,
) -> list[Finding]:
    """Every check on the copy ``net``: data and output first, then mixing, the loss, overfitting."""
    kind = _loss_kind(loss_func)
    probe = _probe(net, inputs)
    samples = [_split(b) for b in batches]
    findings = _input_scale([b[0][0] for b in samples if b[0]], probe.first)
    out = probe.output if isinstance(probe.output, torch.Tensor) else None
    targets = [t for _, t in samples if isinstance(t, torch.Tensor)]
    blocking: list[Finding] = []
    if out is not None and isinstance(target, torch.Tensor) and kind is not None:
        blocking = _labels(kind, loss_func, targets, out, probe) + _output(kind, out, target, probe)
    findings += blocking
    findings += _batch_mixing(net, inputs, target)
    if kind is None or out is None or not isinstance(target, torch.Tensor):
        return findings  # no loss this module knows, or no output/target tensor to compare
    if any(f.severity == "error" for f in blocking):
        return findings  # the loss would fail or mean nothing: fix these first
    chance, _ = _chance_loss(kind, loss_func, out, target)
    with torch.no_grad():
        start = float(loss_func(probe.output, target))
    findings += _init_loss(kind, start, chance, out, target, probe.last_weighted)
    small = tuple(x[:OVERFIT_SAMPLES] if _batched(x, target) else x for x in inputs)
    small_target = target[:OVERFIT_SAMPLES]
    reference, floor = _chance_loss(kind, loss_func, out, small_target)
    reference = start if reference is None else reference  # no chance value known: the loss's own start
    findings += _overfit(net, small, small_target, loss_func, opt_func, lr, steps, reference, floor)
    return findings


def _probe(net: nn.Module, inputs: tuple) -> _Probe:
    """Forward ``inputs`` once, noting which leaf modules run first and last, and the operation that
    made the output (its autograd node: ``SigmoidBackward0`` for a sigmoid applied in a forward)."""
    probe = _Probe(output=None, names={id(m): n for n, m in net.named_modules()})
    done: list[tuple[str, nn.Module, Any]] = []
    with HookSet() as hooks:
        for module in net.modules():
            if next(module.children(), None) is None:
                hooks.forward(module, lambda m, a, o: done.append((probe.names[id(m)], m, o)))
        output = net(*inputs)
    grad_fn = getattr(output, "grad_fn", None)
    probe.final_op = grad_fn.name() if grad_fn is not None else ""
    probe.output = map_tensors(torch.Tensor.detach, output)
    if done:
        probe.first = done[0][0]
        probe.last, probe.last_module, last_output = done[-1]
        probe.last_is_output = last_output is output
    probe.last_weighted = next(
        (name for name, m, _ in reversed(done) if next(m.parameters(), None) is not None), probe.last
    )
    return probe


def _input_scale(inputs: Sequence[Any], first: str) -> list[Finding]:
    """Inputs far from normalised: large (raw 0-255 pixels), tiny, or one feature on another scale."""
    floats = [x.detach() for x in inputs if isinstance(x, torch.Tensor) and x.is_floating_point()]
    if not floats or any(x.dim() != floats[0].dim() for x in floats) or floats[0].dim() < 2:
        return []
    x = torch.cat(floats)[:SAMPLE_SIZE].double()
    if not bool(x.isfinite().all()):
        return []  # NaN/Inf inputs are the non-finite guard's business
    rms, peak = float(x.square().mean().sqrt()), float(x.abs().max())
    where = f"the inputs to `{first}`" if first else "the inputs"
    evidence = {"rms": rms, "min": float(x.min()), "max": float(x.max()), "mean": float(x.mean())}
    one_feature = _feature_scale(x, where, first)
    if one_feature:
        return one_feature
    if rms > LARGE_RMS:
        pixels = evidence["min"] >= 0 and evidence["max"] <= 255 and bool((x == x.round()).all())
        cause = "raw 0-255 pixel values; divide by 255, then" if pixels else "far from unit scale;"
        return [
            _finding(
                "input_scale",
                first,
                "warning",
                f"{where} have RMS {rms:.3g} (range {evidence['min']:.3g} .. {evidence['max']:.3g}): {cause} "
                "subtract the training set's mean and divide by its std (per channel or feature)",
                evidence,
            )
        ]
    if 0 < peak < TINY_MAX:
        return [
            _finding(
                "input_scale",
                first,
                "warning",
                f"{where} are tiny (largest |value| {peak:.3g}): scaled twice? Standardise them "
                "(mean 0, std 1)",
                evidence,
            )
        ]
    return []


def _feature_scale(x: torch.Tensor, where: str, first: str) -> list[Finding]:
    """One feature (2-D inputs) or channel (images, 4-D and more) on a scale far from the others."""
    if x.dim() == 3:
        return []  # (N, C, L) or (N, T, F): which dimension holds the features is not known
    columns = x.transpose(0, 1).reshape(x.shape[1], -1)
    per_feature = columns.square().mean(1).sqrt()
    # sparse columns (one-hot, counts of rare words) are not the scale of the data
    live = per_feature[(columns != 0).double().mean(1) >= DENSE_FRACTION]
    if len(live) < 2:
        return []
    median, top = float(live.median()), int(per_feature.argmax())
    ratio = float(per_feature[top]) / median
    if ratio <= FEATURE_RATIO:
        return []
    unit = "feature" if x.dim() == 2 else "channel"
    return [
        _finding(
            "input_scale",
            first,
            "warning",
            f"{where}: {unit} {top} has RMS {float(per_feature[top]):.3g}, {ratio:.0f}x the median {unit}'s "
            f"({median:.3g}); standardise each {unit} (subtract its mean, divide by its std)",
            {unit: top, "rms": float(per_feature[top]), "median_rms": median, "ratio": ratio},
        )
    ]


def _labels(
    kind: str, loss_func: Any, targets: list[torch.Tensor], out: torch.Tensor, probe: _Probe
) -> list[Finding]:
    """Targets that cannot teach: one class only, labels out of range, regression targets all equal."""
    y = torch.cat([t.detach().reshape(-1).cpu() for t in targets]) if targets else torch.empty(0)
    if y.numel() == 0:
        return []
    if kind in ("multiclass", "nll") and not y.is_floating_point():
        y = y[y != getattr(loss_func, "ignore_index", -100)]
        return _class_labels(y, out, probe)
    if kind in ("multiclass", "nll"):
        if targets[0].shape == out.shape:
            return []  # class probabilities
        return [
            _label_finding(
                "targets are floats but CrossEntropyLoss/NLLLoss needs class indices: use .long()", y
            )
        ]
    if kind in _CLASSIFICATION:
        low, high = float(y.min()), float(y.max())
        if low < 0 or high > 1:
            return [_label_finding(f"binary targets reach {low:g} .. {high:g}; they must lie in [0, 1]", y)]
        if len(y) >= MIN_LABELS_ONE_CLASS and low == high:
            return [_label_finding(f"every target is {low:g} in {len(y)} targets seen: one class only", y)]
        return []
    if len(y) >= 2 and float(y.float().std()) == 0:
        return [_label_finding(f"every regression target equals {float(y[0]):g}: nothing to learn", y)]
    return []


def _class_labels(y: torch.Tensor, out: torch.Tensor, probe: _Probe) -> list[Finding]:
    if y.numel() == 0:
        return []
    low, high, classes = int(y.min()), int(y.max()), out.shape[1] if out.dim() >= 2 else 1
    if low < 0:
        return [
            _label_finding(f"class labels reach {low}; they must lie in 0 .. C-1 (or be the ignore_index)", y)
        ]
    if high >= classes:
        return [
            _finding(
                "output_loss_mismatch",
                probe.last_weighted,
                "error",
                f"`{probe.last_weighted}` outputs {classes} class score(s) but the targets reach class "
                f"{high}: give the last layer {high + 1} (or more) outputs, or remap the labels to "
                f"0 .. {classes - 1}",
                {"output_classes": classes, "max_label": high},
            )
        ]
    if len(y) >= MIN_LABELS_ONE_CLASS and low == high:
        return [_label_finding(f"every label is class {low} in {len(y)} targets seen: one class only", y)]
    seen = int(torch.unique(y).numel())
    if seen == high + 1 and len(y) >= 10 * classes and classes >= 2 * seen:
        return [
            _finding(
                "output_loss_mismatch",
                probe.last_weighted,
                "warning",
                f"`{probe.last_weighted}` outputs {classes} class scores but {len(y)} targets use only "
                f"classes 0 .. {high}: give the last layer {seen} outputs",
                {"output_classes": classes, "classes_seen": seen},
            )
        ]
    return []


def _label_finding(problem: str, y: torch.Tensor) -> Finding:
    return _finding(
        "label_problem",
        "",
        "error",
        f"{problem}. Check the target column and the label mapping, and shuffle data sorted by class",
        {"targets_seen": len(y), "min": float(y.min()), "max": float(y.max())},
    )


def _output(kind: str, out: torch.Tensor, target: torch.Tensor, probe: _Probe) -> list[Finding]:
    """An output the loss cannot use as it is: its activation applied twice, outside what the loss takes,
    bounded below the targets, or shaped so that the loss broadcasts it."""
    name = probe.last
    if out.shape[0] != target.shape[0]:
        problem = (
            f"the output has {out.shape[0]} rows for {target.shape[0]} targets: a view/reshape lost the "
            "batch dimension; flatten with x.flatten(1), not x.view(-1, ...)"
        )
        return [
            _mismatch(name, problem, {"output_shape": list(out.shape), "target_shape": list(target.shape)})
        ]
    values = out.detach().float()
    rows = values.dim() >= 2 and values.shape[1] >= 2
    sums_to_one = rows and bool(values.min() >= 0) and _close(values.sum(1), 1.0)
    log_probs = rows and bool(values.max() <= 0) and _close(values.logsumexp(1), 0.0)
    if kind == "multiclass" and sums_to_one:
        return [
            _mismatch(
                name,
                "the output is already a softmax (rows sum to 1) and CrossEntropyLoss applies "
                "log_softmax again: return the raw scores (remove the softmax)",
                _range(values),
            )
        ]
    if kind == "nll" and not log_probs:
        fix = "apply log_softmax, not softmax" if sums_to_one else "end the model with log_softmax"
        return [
            _mismatch(
                name,
                f"NLLLoss needs log-probabilities and the output is not: {fix} (or use "
                "CrossEntropyLoss on raw scores)",
                _range(values),
            )
        ]
    if kind == "binary_logits" and _bounded(probe) == (0.0, 1.0):
        return [
            _mismatch(
                name,
                f"the output already went through a sigmoid ({_activation(probe)}) and "
                "BCEWithLogitsLoss applies one again: return the raw scores",
                _range(values),
            )
        ]
    if kind == "binary_probs" and (bool(values.min() < 0) or bool(values.max() > 1)):
        return [
            _mismatch(
                name,
                "BCELoss needs probabilities and the output leaves [0, 1]: use "
                "BCEWithLogitsLoss on the raw scores",
                _range(values),
            )
        ]
    if kind in _REGRESSION:
        return _regression_output(values, target, probe)
    return []


def _regression_output(values: torch.Tensor, target: torch.Tensor, probe: _Probe) -> list[Finding]:
    name = probe.last
    if values.shape != target.shape and _broadcast(values.shape, target.shape) != target.shape:
        shape = _broadcast(values.shape, target.shape)
        meets = f"broadcast to {tuple(shape)}" if shape else "do not broadcast"
        return [
            _mismatch(
                name,
                f"output {tuple(values.shape)} and targets {tuple(target.shape)} {meets} in the loss: "
                "reshape one to the other's shape (e.g. out.squeeze(1))",
                {"output_shape": list(values.shape), "target_shape": list(target.shape)},
            )
        ]
    bounds = _bounded(probe)
    low, high = float(target.min()), float(target.max())
    if bounds is None or (bounds[0] <= low and high <= bounds[1]):
        return []
    return [
        _finding(
            "output_loss_mismatch",
            name,
            "warning",
            f"`{name}` ({_activation(probe)}) bounds the output to "
            f"[{bounds[0]:g}, {bounds[1]:g}] but the targets reach [{low:.3g}, {high:.3g}]: remove it, or "
            "scale the targets into its range",
            {"output_bounds": list(bounds), "target_min": low, "target_max": high},
        )
    ]


def _bounded(probe: _Probe) -> tuple[float, float] | None:
    """The bounds of the model's output when a bounded activation made it: its last module (when nothing
    was applied after it), or the operation that made the output."""
    module = probe.last_module if probe.last_is_output else None
    if isinstance(module, nn.Hardtanh):
        return float(module.min_val), float(module.max_val)
    by_module = next((b for t, b in _BOUNDED.items() if isinstance(module, t)), None)
    return by_module or _BOUNDED_OPS.get(probe.final_op)


def _activation(probe: _Probe) -> str:
    """What made the output, in words: the last module's type, or the operation."""
    if probe.last_is_output:
        return type(probe.last_module).__name__
    return probe.final_op.removesuffix("Backward0").lower() or "an activation"


def _mismatch(name: str, problem: str, evidence: dict[str, Any]) -> Finding:
    where = f"`{name}`: " if name else ""
    return _finding("output_loss_mismatch", name, "error", where + problem, evidence)


def _batch_mixing(net: nn.Module, inputs: tuple, target: Any) -> list[Finding]:
    """Back-propagate from one sample's output and find the module where other samples get gradient.

    A culprit found with one probe batch size is confirmed with a second one when the batch allows: a
    non-batch dimension (a sequence length made inside the model) that happens to equal the first size
    cannot equal both.
    """
    sizes = _mixing_sizes(inputs, target)
    culprits = _mixing_probe(net, inputs, target, sizes[0]) if sizes else []
    if culprits and len(sizes) > 1:
        confirmed = {c.name for c in _mixing_probe(net, inputs, target, sizes[1])}
        culprits = [c for c in culprits if c.name in confirmed]
    if not culprits:
        return []
    first = min(culprits, key=lambda c: c.index)
    return [_mixing_finding(first, culprits, sizes[0])]


def _mixing_probe(net: nn.Module, inputs: tuple, target: Any, n: int) -> list[_Call]:
    """The module calls that mix samples in a forward and backward of ``n`` samples."""
    probe_inputs = tuple(_probe_input(x, n, target) for x in inputs)
    calls: list[_Call] = []
    names = {id(m): name for name, m in net.named_modules()}
    with HookSet() as hooks, _batch_norm_frozen(net):
        for module in net.modules():
            hooks.forward(module, _call_recorder(calls, names, n))
        out = first_tensor(net(*probe_inputs))
        if out is None or not out.requires_grad or out.dim() == 0 or out.shape[0] != n:
            return []
        traced = [c for c in calls if c.input is not None and c.output is not None]
        return _mixing_culprits(out, traced, n)


@dataclass(eq=False)
class _Call:
    """One module call seen by the mixing probe: its first batch-first input and output tensors, and for
    a mixing module with children, the last of them whose output still held every sample apart."""

    name: str
    module: nn.Module
    index: int
    input: torch.Tensor | None
    output: torch.Tensor | None
    after: str = ""


def _call_recorder(calls: list[_Call], names: dict[int, str], n: int) -> Callable[..., None]:
    def hook(module: nn.Module, args: Any, output: Any) -> None:
        calls.append(
            _Call(names[id(module)], module, len(calls), _batch_tensor(args, n), _batch_tensor(output, n))
        )

    return hook


def _batch_tensor(value: Any, n: int) -> torch.Tensor | None:
    """The first tensor in ``value`` that is part of the graph and has ``n`` rows."""
    return next((t for t in tensors_in(value) if t.requires_grad and t.dim() > 0 and t.shape[0] == n), None)


def _mixing_culprits(out: torch.Tensor, calls: list[_Call], n: int) -> list[_Call]:
    """The module calls that mix samples, from the last to the first along the forward pass.

    A call mixes when its input gets gradient in rows whose output got none; the innermost such call is
    the culprit. From the model's output only the last culprit shows (everything before it sees every
    row), so each round starts again from the culprit's input, until no call mixes. BatchNorm with batch
    statistics (``track_running_stats=False``) mixes by design: it is passed over, not reported.
    """
    row, seed, culprits = n // 2, out, []
    for _ in range(MIXING_ROUNDS):
        tensors = [t for c in calls for t in (c.input, c.output)]
        grads = torch.autograd.grad(seed[row].sum(), tensors, allow_unused=True, retain_graph=True)
        rows = {id(t): _rows(g, n) for t, g in zip(tensors, grads, strict=True)}
        mixing = [c for c in calls if rows[id(c.output)] and rows[id(c.input)] - rows[id(c.output)]]
        mixing = [c for c in mixing if all(c is not k for k in culprits)]
        mixing = [c for c in mixing if not any(_inside(o.name, c.name) for o in mixing)]
        if not mixing:
            break
        latest = max(mixing, key=lambda c: c.index)
        mixed = [c.name for c in calls if _inside(c.name, latest.name) and rows[id(c.output)] - {row}]
        latest.after = mixed[-1] if mixed else ""
        culprits.append(latest)
        seed = latest.input
    return [c for c in culprits if not isinstance(c.module, _BATCH_NORMS)]


def _mixing_finding(first: _Call, culprits: list[_Call], n: int) -> Finding:
    kind = type(first.module).__name__
    where = f"`{first.name}` ({kind})" if first.name else f"the model's own forward ({kind})"
    if isinstance(first.module, _SEQUENCE_FIRST) and not getattr(first.module, "batch_first", True):
        fix = "it takes the sequence first by default: pass batch_first=True (or feed (seq, batch, ...))"
    else:
        after = f" after `{first.after}`" if first.after else ""
        fix = (
            f"a view/reshape{after} moves data across the batch dimension: reorder dimensions with "
            "permute/transpose (not view) and keep the batch first"
        )
    return _finding(
        "batch_mixing",
        first.name,
        "error",
        f"samples mix in {where}: the gradient of one sample's output reaches other samples' inputs "
        f"in training mode; {fix}",
        {"probe_samples": n, "modules": [c.name for c in sorted(culprits, key=lambda c: c.index)]},
    )


def _init_loss(
    kind: str, start: float, chance: float | None, out: torch.Tensor, target: torch.Tensor, last: str
) -> list[Finding]:
    """The loss at initialisation far above what chance (or predicting the mean) gives."""
    if chance is None or chance <= 0 or not math.isfinite(start):
        return []
    family = "classification" if kind in _CLASSIFICATION else "regression"
    ratio = start / chance
    if ratio <= INIT_LOSS_FACTOR[family]:
        return []
    values = out.detach().float()
    evidence = {"loss": start, "expected": chance, "ratio": ratio, "output_std": float(values.std())}
    if family == "classification":
        cause = (
            f"the scores start large (std {evidence['output_std']:.3g}), so the model is confidently wrong: "
            f"initialise `{last}` with small weights (e.g. nn.init.normal_(w, std=0.01)) and a zero bias"
        )
    else:
        mean = float(target.float().mean())
        evidence["target_mean"] = mean
        cause = (
            f"the targets' mean is {mean:.3g} and the outputs start near {float(values.mean()):.3g}: set "
            f"`{last}`'s bias to the targets' mean, or standardise the targets"
        )
    return [
        _finding(
            "init_loss",
            last,
            "warning",
            f"the loss at initialisation is {start:.4g}, {ratio:.1f}x the {chance:.4g} that chance "
            f"gives; {cause}",
            evidence,
        )
    ]


def _overfit(
    net: nn.Module,
    inputs: tuple,
    target: torch.Tensor,
    loss_func: Callable[..., torch.Tensor],
    opt_func: Callable[..., torch.optim.Optimizer] | None,
    lr: float,
    steps: int,
    reference: float,
    floor: float,
) -> list[Finding]:
    """Train on one small batch; a model that cannot drive its loss near zero there has a bug (or, when
    the loss falls but too slowly, a learning rate or a start to fix)."""
    if not math.isfinite(reference) or reference <= floor:
        return []
    goal = floor + OVERFIT_FRACTION * (reference - floor)
    opt = (opt_func or torch.optim.Adam)([p for p in net.parameters() if p.requires_grad], lr=lr)
    losses: list[torch.Tensor] = []
    for step in range(1, steps + 1):
        opt.zero_grad(set_to_none=True)
        loss = loss_func(net(*inputs), target)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
        if step % 10 and step != steps:
            continue
        last = float(losses[-1])
        if not math.isfinite(last) or last <= goal:
            break
    history = torch.stack(losses).float()
    last, best = float(history[-1]), float(history.nan_to_num(math.inf).min())
    if math.isfinite(last) and last <= goal:
        return []
    falling = math.isfinite(last) and best < OVERFIT_PROGRESS * float(history[0])
    if not math.isfinite(last):
        cause = "the loss became NaN/Inf: lower the learning rate"
    elif falling:
        cause = "the loss falls, too slowly: raise the learning rate, or fix a poor start (see init_loss)"
    else:
        cause = (
            "check that inputs and targets are paired, that every layer gets gradient (nothing detached "
            "or frozen), the learning rate, and regularisation (dropout, weight decay) against memorising"
        )
    return [
        _finding(
            "cannot_overfit",
            "",
            "warning" if falling else "error",
            f"the model cannot fit one batch of {len(target)} samples: after {len(losses)} steps at lr "
            f"{lr:g} the loss is {last:.4g} (best {best:.4g}, start {float(history[0]):.4g}, goal "
            f"{goal:.4g}); {cause}",
            {
                "samples": len(target),
                "steps": len(losses),
                "lr": lr,
                "start": float(history[0]),
                "best": best,
                "last": last,
                "goal": goal,
            },
        )
    ]


# ---- helpers ---------------------------------------------------------------------------------------------


def _finding(kind: str, module: str, severity: str, message: str, evidence: dict[str, Any]) -> Finding:
    return Finding(kind, module, 0, severity, message, evidence)


def _split(batch: Any) -> tuple[tuple, Any]:
    """``(inputs, target)`` as the Learner splits a batch: the last item is the target."""
    if isinstance(batch, torch.Tensor):
        return (batch,), None
    if not isinstance(batch, tuple | list) or not batch:
        raise TypeError(
            f"preflight: a batch is a {type(batch).__name__}; batches must be (inputs, targets) tuples"
        )
    if len(batch) == 1:
        return tuple(batch), None
    return tuple(batch[:-1]), batch[-1]


def _loss_kind(loss_func: Any) -> str | None:
    """Which loss family ``loss_func`` is (an nn loss module or its functional form), or None."""
    kind = _LOSS_KINDS.get(type(loss_func))
    if kind is None:
        try:
            kind = _LOSS_KINDS.get(loss_func)
        except TypeError:  # unhashable callable
            return None
    if kind is not None and getattr(loss_func, "reduction", "mean") != "mean":
        return None  # the chance values below are per-sample means
    return kind


def _chance_loss(
    kind: str, loss_func: Any, out: torch.Tensor, target: torch.Tensor
) -> tuple[float | None, float]:
    """What the loss is for a model that knows nothing (uniform scores; the targets' mean or median), and
    the smallest loss it can reach (above 0 with label smoothing)."""
    y = target.detach().float()
    if kind in ("multiclass", "nll"):
        classes = out.shape[1] if out.dim() >= 2 else 1
        eps = float(getattr(loss_func, "label_smoothing", 0.0)) if kind == "multiclass" else 0.0
        return math.log(classes), _smoothed_entropy(eps, classes)
    if kind in ("binary_logits", "binary_probs"):
        return math.log(2), 0.0
    if kind == "mse":
        return float(y.var(unbiased=False)), 0.0
    if kind == "l1":
        return float((y - y.median()).abs().mean()), 0.0
    return None, 0.0


def _smoothed_entropy(eps: float, classes: int) -> float:
    """The entropy of a one-hot target smoothed by ``eps``: cross-entropy's lowest value."""
    if eps <= 0 or classes < 2:
        return 0.0
    high, low = 1 - eps + eps / classes, eps / classes
    return -(high * math.log(high) + (classes - 1) * low * math.log(low))


def _mixing_sizes(inputs: tuple, target: Any) -> list[int]:
    """Probe batch sizes no other dimension of the data has, so that only batch rows can have them (the
    whole batch when it is smaller than all of them; none for a single sample)."""
    tensors = [t for t in (*inputs, target) if isinstance(t, torch.Tensor) and t.dim() > 0]
    available = min((len(t) for t in tensors), default=0)
    other = {d for t in tensors for d in t.shape[1:]}
    sizes = [n for n in MIXING_SIZES if n <= available and n not in other]
    return sizes or ([available] if available >= 2 else [])


def _probe_input(x: Any, n: int, target: Any) -> Any:
    if not _batched(x, target):
        return x
    x = x[:n].detach()
    return x.clone().requires_grad_(True) if x.is_floating_point() else x


def _batched(x: Any, target: Any) -> bool:
    """Whether input ``x`` holds one row per sample (its first dimension matches the target's)."""
    if not isinstance(x, torch.Tensor) or x.dim() == 0:
        return False
    return not isinstance(target, torch.Tensor) or target.dim() == 0 or x.shape[0] == target.shape[0]


def _rows(grad: torch.Tensor | None, n: int) -> frozenset[int]:
    """The rows of a gradient that hold a non-zero value."""
    if grad is None:
        return frozenset()
    return frozenset(torch.nonzero(grad.detach().reshape(n, -1).abs().amax(1)).flatten().tolist())


def _inside(name: str, parent: str) -> bool:
    """Whether module ``name`` sits inside module ``parent`` (the root ``""`` holds every module)."""
    return name != parent and (parent == "" or name.startswith(parent + "."))


def _broadcast(a: torch.Size, b: torch.Size) -> torch.Size | None:
    """The shape ``a`` and ``b`` broadcast to, or None when they do not."""
    try:
        return torch.broadcast_shapes(a, b)
    except RuntimeError:
        return None


def _close(values: torch.Tensor, expected: float) -> bool:
    return bool(torch.allclose(values, torch.full_like(values, expected), atol=1e-3))


def _range(values: torch.Tensor) -> dict[str, float]:
    return {"output_min": float(values.min()), "output_max": float(values.max())}


@contextmanager
def _batch_norm_frozen(net: nn.Module) -> Iterator[None]:
    """BatchNorm layers in eval mode (running statistics: no mixing), the rest as it was."""
    norms = [m for m in net.modules() if isinstance(m, _BATCH_NORMS) and m.training]
    for m in norms:
        m.eval()
    try:
        yield
    finally:
        for m in norms:
            m.train()


@contextmanager
def _random_state_kept(loader: Any) -> Iterator[None]:
    """Restore torch's (CPU and initialised CUDA), numpy's and Python's generators, and the loader's own."""
    import numpy as np

    python_state, numpy_state = random.getstate(), np.random.get_state()
    generators = [(g, g.get_state()) for g in _loader_generators(loader)]
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)
        for g, state in generators:
            g.set_state(state)


def _loader_generators(loader: Any) -> list[torch.Generator]:
    """The generators a DataLoader draws its order from (its own, its sampler's), each once."""
    found: dict[int, torch.Generator] = {}
    for owner in (
        loader,
        getattr(loader, "sampler", None),
        getattr(getattr(loader, "batch_sampler", None), "sampler", None),
    ):
        g = getattr(owner, "generator", None)
        if isinstance(g, torch.Generator):
            found[id(g)] = g
    return list(found.values())
