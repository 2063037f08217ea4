"""What the hooks features name and compare of one step of a forward: an aten op's name, and the tensors
in a value that can hold a NaN or differ beyond a tolerance.

``find_nonfinite`` and ``compare`` both watch every aten op under a ``TorchDispatchMode`` and report the
one where something starts; they name it and pick its tensors with these, so the two reports agree.
"""

from __future__ import annotations

from typing import Any

import torch

from hookscope.hooks.tensors import tensors_in


def op_name(func: Any) -> str:
    """The name a report gives an aten op: ``aten.log.default`` -> ``aten.log`` (the overload adds
    nothing a user can act on); a name without the ``aten.`` prefix gets it."""
    packet = getattr(func, "overloadpacket", None)
    name = str(packet) if packet is not None else str(func)
    return name if name.startswith("aten.") else f"aten.{name}".replace("aten.aten.", "aten.")


def float_tensors(obj: Any) -> list[torch.Tensor]:
    """The floating-point and complex tensors inside a nested value (walked as
    :func:`~hookscope.hooks.tensors.tensors_in` does), in order: the only ones that can be non-finite
    (integers and booleans always are finite) or differ by a relative tolerance."""
    return [t for t in tensors_in(obj) if t.is_floating_point() or t.is_complex()]
