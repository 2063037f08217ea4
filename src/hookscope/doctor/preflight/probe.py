"""The one forward every preflight check builds on, and the pieces they share.

:func:`run_probe` runs the copy once in training mode and records the output, the first and last leaf
modules that ran and the operation that made the output; the label and output checks name the module
they blame from it. :func:`inputs_and_target` and :func:`batched` read a batch as the Learner does
(the last item is the target; inputs with one row per target are batched), and :func:`finding` builds
a preflight finding (step 0: it comes before training).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from hookscope.doctor.findings import Finding
from hookscope.hooks.batch import split_batch
from hookscope.hooks.handles import HookSet
from hookscope.hooks.tensors import map_tensors


@dataclass
class Probe:
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


def run_probe(net: nn.Module, inputs: tuple) -> Probe:
    """Forward ``inputs`` once, noting which leaf modules run first and last, and the operation that
    made the output (its autograd node: ``SigmoidBackward0`` for a sigmoid applied in a forward)."""
    probe = Probe(output=None, names={id(m): n for n, m in net.named_modules()})
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


def inputs_and_target(batch: Any) -> tuple[tuple, Any]:
    """The inputs and the one target (None without) of a batch, split as the Learner splits it
    (:func:`~hookscope.hooks.batch.split_batch`); preflight compares outputs with targets, so a batch
    that is neither a tensor nor an ``(inputs, targets)`` tuple is refused."""
    readable = isinstance(batch, torch.Tensor) or (isinstance(batch, tuple | list) and len(batch) > 0)
    if not readable:
        raise TypeError(
            f"preflight: a batch is a {type(batch).__name__}; batches must be (inputs, targets) tuples"
        )
    inputs, targets = split_batch(batch)
    return inputs, targets[0] if targets else None


def batched(x: Any, target: Any) -> bool:
    """Whether input ``x`` holds one row per sample (its first dimension matches the target's)."""
    if not isinstance(x, torch.Tensor) or x.dim() == 0:
        return False
    return not isinstance(target, torch.Tensor) or target.dim() == 0 or x.shape[0] == target.shape[0]


def finding(kind: str, module: str, severity: str, message: str, evidence: dict[str, Any]) -> Finding:
    """A finding of one preflight check, at step 0: the checks run before training."""
    return Finding(kind, module, 0, severity, message, evidence)
