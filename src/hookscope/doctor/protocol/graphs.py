"""``graph_kept_alive``: autograd graphs of earlier forwards still alive.

``total += loss`` instead of ``total += loss.item()``, a list of predictions that still require grad, or
a validation loop without ``torch.no_grad()`` that sums its losses keeps each forward's autograd graph
alive (and with it whatever it holds): memory grows step after step.

A graph's nodes cannot be weakly referenced, but ``grad_fn.metadata`` is a dict that lives exactly as
long as the node. After each forward of the model with autograd (on the steps :mod:`~.looks` watches,
and every evaluation forward), a small sentinel is put in the metadata of its output's ``grad_fn``, and
a weak reference to the sentinel kept (the last :data:`TRACKED` forwards). That node is an ancestor of
everything computed from the output — the loss, a sum of losses, the output itself kept in a list — so
it lives as long as any of them: the sentinels still alive at a check are the forwards whose graph is
still held. The forwards of the optimizer step just done are not counted: their graphs fed that step's
backward, and a loop holds them until its next step (the ``out`` and ``loss`` variables; a REINFORCE
loop's list of an episode's log-probabilities, one forward per move). More than :data:`KEPT` forwards
held past their step, or made outside any step (an evaluation with autograd), at two checks in a row,
and more at the second, is a finding. Host objects only: no tensor is touched, and the loss need
not be logged. Memory: on CUDA, the growth of ``torch.cuda.memory_allocated`` (a host counter) between
the two checks, over the steps between them; on other devices it is not estimated.
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
        self._alive: deque[tuple[int, int, weakref.ref]] = deque(maxlen=TRACKED)  # step, steps done, ref
        self._step = 0
        self._steps_done = 0  # optimizer steps done: the forwards tagged with one less fed the last one
        self._device: torch.device | None = None
        self._last: tuple[int, int, int] | None = None  # (step, graphs alive, bytes allocated)
        self.found: tuple[int, int, int, float | None] | None = None  # step, forwards, steps, bytes/step

    def begin_batch(self, step: int, training: bool) -> None:
        if training:
            self._step = step

    def forward_output(self, output: torch.Tensor | None) -> None:
        """A forward with autograd returned ``output``: tag its graph."""
        node = output.grad_fn if output is not None else None
        if node is None or METADATA_KEY in node.metadata:
            return
        sentinel = node.metadata[METADATA_KEY] = _Alive()
        self._alive.append((self._step, self._steps_done, weakref.ref(sentinel)))
        self._device = output.device

    def step_done(self) -> None:
        self._steps_done += 1

    def check(self) -> None:
        """Count the forwards whose graph is still alive, but for those of the step just done; two
        growing counts above :data:`KEPT` report."""
        last_step = self._steps_done - 1
        alive = [step for step, done, ref in self._alive if done != last_step and ref() is not None]
        allocated = self._allocated()
        last, self._last = self._last, (self._step, len(alive), allocated)
        if self.found is not None or last is None or len(alive) <= KEPT or len(alive) <= last[1]:
            return
        per_step = None
        if allocated >= 0 and last[2] >= 0 and self._step > last[0]:
            per_step = (allocated - last[2]) / (self._step - last[0])
        self.found = (min(alive), len(alive), len(set(alive)), per_step)

    def findings(self) -> list[Finding]:
        if self.found is None:
            return []
        since, forwards, steps, per_step = self.found
        memory = (
            f"memory grows by about {per_step / 2**20:.1f} MiB a step"
            if per_step is not None
            else "the memory they hold is not measured on this device"
        )
        message = (
            f"the autograd graphs of {forwards} forwards over {steps} step(s) since step {since} are still "
            "alive, and more at every check — something keeps each loss or prediction with its graph "
            "(`total += loss`, a list of outputs that require grad, a validation loop without "
            f"`torch.no_grad()`); {memory}. Keep numbers, not graphs: `total += loss.item()` (or "
            "`loss.detach()` to stay on the device), `preds.append(out.detach())`, and evaluate under "
            "`torch.no_grad()`."
        )
        evidence = {"forwards_kept": forwards, "steps_kept": steps, "bytes_per_step": per_step}
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
