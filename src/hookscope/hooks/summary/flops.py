"""Count the floating-point work of a forward, op by op, with the formulas torch keeps for FlopCounterMode.

``torch.utils.flop_counter`` holds a FLOP formula per aten op: convolutions, ``mm``/``bmm``/``addmm`` (so a
Linear applied to any number of leading dimensions is counted in full) and the CUDA attention kernels.
:class:`FlopCounter` applies those formulas in a lean dispatch mode that keeps one running total; the module
bookkeeping ``FlopCounterMode`` also does is done per call by the summary's tracer, and its attempt to run a
Python decomposition of every op without a formula (batch norm: more time than the whole ResNet forward,
for zero FLOPs) is skipped. Two paths a CPU forward takes count zero in ``FlopCounterMode``: the
flash-attention kernel ``scaled_dot_product_attention`` picks on CPU, and the fused fast path of
``nn.MultiheadAttention`` / ``nn.TransformerEncoderLayer`` in eval mode; so does the oneDNN LSTM kernel.
:class:`FlopCounter` adds formulas for the kernels and switches the fast path off while counting, so those
layers run composed ops that are counted like everything else.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import TracebackType
from typing import Any

import torch
from torch.utils.flop_counter import flop_registry

from hookscope.compat import SDPA_FLASH_CPU, TorchDispatchMode
from hookscope.hooks.tensors import map_tensors

aten = torch.ops.aten


def sdpa_flops(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any, **kwargs: Any) -> int:
    """FLOPs of ``softmax(q @ k^T) @ v`` from the shapes alone: two batched matmuls, 2 FLOPs per MAC.

    Leading dimensions of the query (batch, heads) multiply; grouped-query attention broadcasts key/value
    heads, so the key/value head count does not enter.
    """
    batch = math.prod(query.shape[:-2])
    q_len, head_dim = query.shape[-2], query.shape[-1]
    k_len, v_dim = key.shape[-2], value.shape[-1]
    return 2 * batch * q_len * k_len * head_dim + 2 * batch * q_len * k_len * v_dim


def lstm_layer_flops(
    input: torch.Tensor, weight_ih: torch.Tensor, weight_hh: torch.Tensor, *args: Any, **kwargs: Any
) -> int:
    """FLOPs of one LSTM layer and direction run by oneDNN on CPU: input and hidden projections per step.

    The same count as the matmuls of the composed LSTM (what FlopCounterMode sees on other devices).
    """
    steps_times_batch = input.numel() // input.shape[-1]
    return 2 * steps_times_batch * weight_ih.shape[0] * (weight_ih.shape[1] + weight_hh.shape[1])


EXTRA_FORMULAS: dict[Any, Callable[..., int]] = {
    SDPA_FLASH_CPU: sdpa_flops,
    aten.mkldnn_rnn_layer: lstm_layer_flops,
}


class FlopCounter(TorchDispatchMode):
    """Dispatch mode adding up the FLOPs of every aten op run inside it; ``total()`` reads the running sum.

    Reading ``total()`` before and after a module's forward gives that call's FLOPs, which is how
    ``hs.summary`` attributes work to the innermost running module. One MAC is two FLOPs. Counting is
    shape arithmetic on the host: no device sync.
    """

    def __init__(self) -> None:
        super().__init__()
        self._flops = 0
        self._fastpath_was = True

    def total(self) -> int:
        """FLOPs counted so far."""
        return self._flops

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func.overloadpacket
        if packet in EXTRA_FORMULAS:
            self._flops += EXTRA_FORMULAS[packet](*args, **kwargs)
        elif packet in flop_registry:
            self._flops += _apply(flop_registry[packet], args, kwargs, out)
        return out

    def __enter__(self) -> FlopCounter:
        self._fastpath_was = torch.backends.mha.get_fastpath_enabled()
        torch.backends.mha.set_fastpath_enabled(False)
        try:
            super().__enter__()
        except BaseException:
            torch.backends.mha.set_fastpath_enabled(self._fastpath_was)
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            super().__exit__(exc_type, exc, tb)
        finally:
            torch.backends.mha.set_fastpath_enabled(self._fastpath_was)


def _apply(formula: Callable[..., int], args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    """Call a registered formula. Most are wrapped (``functools.wraps``) by torch's ``shape_wrapper``, which
    maps every argument through pytree to get shapes; that costs more than the rest of the counting, so the
    wrapped formula gets the shapes directly. Formulas registered raw take the tensors themselves."""
    shaped = getattr(formula, "__wrapped__", None)
    if shaped is None:
        return formula(*args, **kwargs, out_val=out)
    return shaped(
        *map(_shape_of, args), **{k: _shape_of(v) for k, v in kwargs.items()}, out_shape=_shape_of(out)
    )


def _shape_of(value: Any) -> Any:
    """``value`` with every tensor replaced by its shape (what torch's shape-based formulas take)."""
    return map_tensors(lambda t: t.shape, value)
