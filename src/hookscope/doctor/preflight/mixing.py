"""``batch_mixing``: samples that mix across the batch dimension in training mode (a view/reshape over the
batch, a sequence-first layer fed batch-first data), found by back-propagating from one sample's output
and tracing which module lets other samples' rows get gradient. BatchNorm runs on its running statistics
during the probe, as it mixes by design."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hookscope.doctor.findings import Finding
from hookscope.doctor.preflight.probe import batched, finding
from hookscope.hooks.handles import HookSet
from hookscope.hooks.tensors import first_tensor, tensors_in

# batch_mixing: sample counts tried for the probe batch (one that no other dimension of the data has),
# and at most this many mixing modules traced back from the output (one backward pass each).
MIXING_SIZES, MIXING_ROUNDS = (3, 5, 7, 11, 13), 6
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


def batch_mixing(net: nn.Module, inputs: tuple, target: Any) -> list[Finding]:
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
    return finding(
        "batch_mixing",
        first.name,
        "error",
        f"samples mix in {where}: the gradient of one sample's output reaches other samples' inputs "
        f"in training mode; {fix}",
        {"probe_samples": n, "modules": [c.name for c in sorted(culprits, key=lambda c: c.index)]},
    )


def _mixing_sizes(inputs: tuple, target: Any) -> list[int]:
    """Probe batch sizes no other dimension of the data has, so that only batch rows can have them (the
    whole batch when it is smaller than all of them; none for a single sample)."""
    tensors = [t for t in (*inputs, target) if isinstance(t, torch.Tensor) and t.dim() > 0]
    available = min((len(t) for t in tensors), default=0)
    other = {d for t in tensors for d in t.shape[1:]}
    sizes = [n for n in MIXING_SIZES if n <= available and n not in other]
    return sizes or ([available] if available >= 2 else [])


def _probe_input(x: Any, n: int, target: Any) -> Any:
    if not batched(x, target):
        return x
    x = x[:n].detach()
    return x.clone().requires_grad_(True) if x.is_floating_point() else x


def _rows(grad: torch.Tensor | None, n: int) -> frozenset[int]:
    """The rows of a gradient that hold a non-zero value."""
    if grad is None:
        return frozenset()
    return frozenset(torch.nonzero(grad.detach().reshape(n, -1).abs().amax(1)).flatten().tolist())


def _inside(name: str, parent: str) -> bool:
    """Whether module ``name`` sits inside module ``parent`` (the root ``""`` holds every module)."""
    return name != parent and (parent == "" or name.startswith(parent + "."))


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
