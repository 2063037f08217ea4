"""``graph_kept_alive``: autograd graphs of earlier steps still alive.

``total += loss`` instead of ``total += loss.item()``, or a list of predictions that still require grad,
keeps each step's autograd graph alive (and with it whatever it holds): memory grows step after step.

A graph's nodes cannot be weakly referenced, but ``loss.grad_fn.metadata`` is a dict that lives exactly
as long as the node. At each logged loss a small sentinel is put in it, and a weak reference to the
sentinel kept (the last :data:`TRACKED` losses). The sentinels still alive at a check are graphs still
alive; a normal loop keeps the current step's (the ``loss`` variable) and at most the one before. More
than :data:`KEPT` steps' graphs at two checks in a row, and more at the second, is a finding. Host
objects only: no tensor is touched. Memory: on CUDA, the growth of ``torch.cuda.memory_allocated``
(a host counter) between the two checks, over the steps between them; on other devices it is not
estimated.

It needs the loss: a loop that does not log it (``log_loss``) cannot be checked.
"""

from __future__ import annotations

import weakref
from collections import deque
from typing import Any

import torch

from hookscope.doctor.findings import Finding

TRACKED = 64
KEPT = 8
METADATA_KEY = "hookscope_alive"


class _Alive:
    """A sentinel in a graph node's metadata: it lives as long as the node."""

    __slots__ = ("__weakref__",)


class GraphsKeptAlive:
    """Weak references to a sentinel in each logged loss's graph (see the module)."""

    def __init__(self) -> None:
        self._alive: deque[tuple[int, weakref.ref]] = deque(maxlen=TRACKED)
        self._step = 0
        self._device: torch.device | None = None
        self._last: tuple[int, int, int] | None = None  # (step, graphs alive, bytes allocated)
        self.found: tuple[int, int, int, float | None] | None = None  # step, steps kept, of, bytes/step

    def begin_batch(self, step: int, training: bool) -> None:
        if training:
            self._step = step

    def log_loss(self, loss: torch.Tensor) -> None:
        node = loss.grad_fn
        if node is None:
            return
        sentinel = node.metadata.get(METADATA_KEY)
        if sentinel is None:
            sentinel = node.metadata[METADATA_KEY] = _Alive()
            self._alive.append((self._step, weakref.ref(sentinel)))
        self._device = loss.device

    def check(self) -> None:
        """Count the graphs of earlier steps still alive; two growing counts above :data:`KEPT` report."""
        steps = {step for step, ref in self._alive if ref() is not None}
        allocated = self._allocated()
        last, self._last = self._last, (self._step, len(steps), allocated)
        if self.found is not None or last is None or len(steps) <= KEPT or len(steps) <= last[1]:
            return
        per_step = None
        if allocated >= 0 and last[2] >= 0 and self._step > last[0]:
            per_step = (allocated - last[2]) / (self._step - last[0])
        self.found = (min(steps), len(steps), len({step for step, _ in self._alive}), per_step)

    def findings(self) -> list[Finding]:
        if self.found is None:
            return []
        since, kept, tracked, per_step = self.found
        every = " (likely every step's)" if kept == tracked else ""
        memory = (
            f"memory grows by about {per_step / 2**20:.1f} MiB a step"
            if per_step is not None
            else "the memory they hold is not measured on this device"
        )
        message = (
            f"the autograd graphs of {kept} of the last {tracked} steps are still alive{every} — something "
            f"keeps each step's loss or predictions with their graph (`total += loss`, a list of outputs "
            f"that require grad); {memory}. Keep numbers, not graphs: `total += loss.item()` (or "
            "`loss.detach()` to stay on the device), `preds.append(out.detach())`."
        )
        evidence = {"steps_kept": kept, "steps_tracked": tracked, "bytes_per_step": per_step}
        return [Finding("graph_kept_alive", "", since, "warning", message, evidence)]

    def state_dict(self) -> dict[str, Any]:
        """What was found; the graphs themselves belong to the process that made them."""
        return {"found": list(self.found) if self.found else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        found = state["found"]
        self.found = (int(found[0]), int(found[1]), int(found[2]), found[3]) if found else None

    def _allocated(self) -> int:
        """Bytes the CUDA caching allocator holds for tensors (a host counter; -1 off CUDA)."""
        device = self._device
        if device is None or device.type != "cuda":
            return -1
        return torch.cuda.memory_allocated(device)
