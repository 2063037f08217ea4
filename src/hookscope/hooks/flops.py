"""Count the floating-point work of a forward pass, op by op, on top of torch's ``FlopCounterMode``.

``FlopCounterMode`` knows the FLOPs of convolutions, ``mm``/``bmm``/``addmm`` (so a Linear applied to any
number of leading dimensions is counted in full) and of the CUDA attention kernels. It counts zero for two
paths a CPU forward takes: the flash-attention kernel ``scaled_dot_product_attention`` picks on CPU, and
the fused fast path of ``nn.MultiheadAttention`` / ``nn.TransformerEncoderLayer`` in eval mode.
:class:`FlopCounter` adds a formula for the first and switches the fast path off while counting, so those
layers run composed ops that are counted like everything else.
"""

from __future__ import annotations

import math
from types import TracebackType
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

aten = torch.ops.aten


def sdpa_flops(
    query_shape: torch.Size, key_shape: torch.Size, value_shape: torch.Size, *args: Any, **kwargs: Any
) -> int:
    """FLOPs of ``softmax(q @ k^T) @ v`` from the shapes alone: two batched matmuls, 2 FLOPs per MAC.

    Leading dimensions of the query (batch, heads) multiply; grouped-query attention broadcasts key/value
    heads.
    """
    batch = math.prod(query_shape[:-2])
    q_len, head_dim = query_shape[-2], query_shape[-1]
    k_len, v_dim = key_shape[-2], value_shape[-1]
    return 2 * batch * q_len * k_len * head_dim + 2 * batch * q_len * k_len * v_dim


EXTRA_FORMULAS = {aten._scaled_dot_product_flash_attention_for_cpu: sdpa_flops}


class FlopCounter:
    """Context manager counting the FLOPs of every aten op run inside it; ``total()`` reads the running sum.

    Reading ``total()`` before and after a module's forward gives that call's FLOPs, which is how
    ``hs.summary`` attributes work to the innermost running module. One MAC is two FLOPs.
    """

    def __init__(self) -> None:
        self._mode = FlopCounterMode(display=False, custom_mapping=EXTRA_FORMULAS)
        self._fastpath_was: bool | None = None

    def total(self) -> int:
        """FLOPs counted so far (a host-side integer computed from shapes; no device sync)."""
        return self._mode.get_total_flops()

    def __enter__(self) -> FlopCounter:
        self._fastpath_was = torch.backends.mha.get_fastpath_enabled()
        torch.backends.mha.set_fastpath_enabled(False)
        try:
            self._mode.__enter__()
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
            self._mode.__exit__(exc_type, exc, tb)
        finally:
            torch.backends.mha.set_fastpath_enabled(bool(self._fastpath_was))
