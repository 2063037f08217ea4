"""Preflight: the checks a careful practitioner runs before training, in seconds, on a copy of the model.

They follow Karpathy's "A Recipe for Training Neural Networks" (verify the loss at initialisation, overfit
one batch, check that samples do not mix, look at the data's scale) and the program checks of UMLAUT and
DeepDiagnosis (inputs not normalised, an output activation the loss applies again, outputs that cannot
reach the targets). Each check returns :class:`~hookscope.doctor.findings.Finding` objects of one kind:
``label_problem``, ``output_loss_mismatch``, ``input_scale``, ``batch_mixing``, ``init_loss``,
``cannot_overfit`` and, when the data has a validation part, ``train_valid_overlap``.

Nothing the user holds changes: the checks run on a deep copy of the model (so its parameters and its
BatchNorm running statistics stay as they were), and torch's, numpy's and Python's random states, as well
as the data loader's own generator, are restored afterwards. Inside, the CPU generator is seeded, so the
same model and data give the same findings.

The checks, one module per concept:

- :mod:`.probe`: the one training-mode forward of the copy that records the first and last modules and
  the output, and how a batch splits into inputs and target;
- :mod:`.inputs`: ``input_scale``, inputs far from normalised;
- :mod:`.outputs`: ``label_problem`` and ``output_loss_mismatch``, targets that cannot teach and outputs
  the loss cannot use as they are;
- :mod:`.mixing`: ``batch_mixing``, samples that mix across the batch dimension in training mode;
- :mod:`.loss`: which loss family the loss function is and what chance gives, ``init_loss`` and
  ``cannot_overfit``;
- :mod:`.overlap`: ``train_valid_overlap``, validation samples that are also training samples (exact
  copies of their inputs, hashed on at most 10,000 samples of each side);
- :mod:`.random_state`: torch's, numpy's, Python's and the loader's generators restored afterwards.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from itertools import islice
from typing import Any

import torch
from torch import nn

from hookscope.doctor.findings import Finding, Findings
from hookscope.doctor.preflight.inputs import input_scale
from hookscope.doctor.preflight.loss import (
    OVERFIT_LR,
    OVERFIT_SAMPLES,
    OVERFIT_STEPS,
    cannot_overfit,
    chance_loss,
    init_loss,
    loss_kind,
)
from hookscope.doctor.preflight.mixing import batch_mixing
from hookscope.doctor.preflight.outputs import label_problem, output_loss_mismatch
from hookscope.doctor.preflight.overlap import train_valid_overlap
from hookscope.doctor.preflight.probe import batched, inputs_and_target, run_probe
from hookscope.doctor.preflight.random_state import random_state_kept
from hookscope.hooks.tensors import map_tensors, model_device

# What the data checks look at: the first batches.
SAMPLE_BATCHES = 4


def preflight(
    model: nn.Module,
    data: Any,
    loss_func: Callable[..., torch.Tensor],
    *,
    opt_func: Callable[..., torch.optim.Optimizer] | None = None,
    lr: float | None = None,
    steps: int | None = None,
) -> Findings:
    """Check ``model``, ``data`` and ``loss_func`` before training; return the problems found.

    ``data`` is a DataLoader, an ``hs.DataLoaders`` or ``(train, valid)`` pair (the training loader is
    used, and compared with the validation one for samples in both) or one ``(inputs, targets)`` batch.
    The overfitting check trains a copy for at most ``steps`` steps (default 300) with ``opt_func``
    (default Adam) at ``lr`` (default 1e-3). The model, its BatchNorm statistics and every random
    generator are left as they were.
    """
    steps = OVERFIT_STEPS if steps is None else steps
    lr = OVERFIT_LR if lr is None else lr
    if steps < 1:
        raise ValueError(f"preflight: steps={steps}; pass steps >= 1 (the overfitting check's budget)")
    loader = training_loader(data, "preflight")
    with random_state_kept(loader):
        torch.default_generator.manual_seed(0)
        batches = list(islice(iter(loader), SAMPLE_BATCHES))
        if not batches:
            raise ValueError(
                "preflight: the training data yields no batch; pass data with at least one batch"
            )
        device = model_device(model)
        inputs, target = inputs_and_target(map_tensors(lambda t: t.to(device), batches[0]))
        net = copy.deepcopy(model).train()
        findings = _check(net, inputs, target, batches, loss_func, opt_func, lr, steps)
    return Findings(findings + train_valid_overlap(loader, validation_loader(data)))


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


def validation_loader(data: Any) -> Any:
    """The validation batches in ``data``: the ``valid`` loader of an ``hs.DataLoaders`` or a ``(train,
    valid)`` pair of loaders; None when there is none (a lone loader or batch)."""
    if hasattr(data, "train") and hasattr(data, "valid"):
        return data.valid
    if isinstance(data, tuple | list) and len(data) == 2 and not isinstance(data[0], torch.Tensor):
        return data[1] if hasattr(data[0], "__iter__") else None
    return None


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
    kind = loss_kind(loss_func)
    probe = run_probe(net, inputs)
    samples = [inputs_and_target(b) for b in batches]
    findings = input_scale([b[0][0] for b in samples if b[0]], probe.first)
    out = probe.output if isinstance(probe.output, torch.Tensor) else None
    targets = [t for _, t in samples if isinstance(t, torch.Tensor)]
    blocking: list[Finding] = []
    if out is not None and isinstance(target, torch.Tensor) and kind is not None:
        labels = label_problem(kind, loss_func, targets, out, probe)
        blocking = labels + output_loss_mismatch(kind, out, target, probe)
    findings += blocking
    findings += batch_mixing(net, inputs, target)
    if kind is None or out is None or not isinstance(target, torch.Tensor):
        return findings  # no loss preflight knows, or no output/target tensor to compare
    if any(f.severity == "error" for f in blocking):
        return findings  # the loss would fail or mean nothing: fix these first
    chance, _ = chance_loss(kind, loss_func, out, target)
    with torch.no_grad():
        start = float(loss_func(probe.output, target))
    findings += init_loss(kind, start, chance, out, target, probe.last_weighted)
    small = tuple(x[:OVERFIT_SAMPLES] if batched(x, target) else x for x in inputs)
    small_target = target[:OVERFIT_SAMPLES]
    reference, floor = chance_loss(kind, loss_func, out, small_target)
    reference = start if reference is None else reference  # no chance value known: the loss's own start
    findings += cannot_overfit(net, small, small_target, loss_func, opt_func, lr, steps, reference, floor)
    return findings
