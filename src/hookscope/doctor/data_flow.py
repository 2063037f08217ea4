"""Which watched module produced each watched module's input: the data flow, read once from autograd.

Registration order says nothing about it: the PyTorch examples' MNIST ``Net`` registers ``dropout1``
before ``fc1``, and ``dropout2``'s input is ``fc1``'s output through ``F.relu``. On one recorded
training step the activation recorder hands every watched module's input and output here
(:meth:`DataFlow.observe`); when the step ends (:meth:`DataFlow.settle`) each module's input is walked
back through its autograd graph (``grad_fn`` and ``next_functions``), across the operations that are no
watched module (``F.relu``, ``F.max_pool2d``, ``torch.flatten``), to the nearest node that a watched
module's output holds: that module is the input's producer. An input without a graph (a frozen layer's
output, data) is matched by storage (``data_ptr``) to an output it is exactly. Done once per attached
model: the graph nodes are held only during that step, and later steps pay one attribute check per hook.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch

_MAX_NODES = 100_000
"""How many graph nodes one input's walk visits at most (a walk stops at the nearest producer; this
bounds the walk from an input no watched module produced, through a huge graph)."""


class DataFlow:
    """The producer of each watched module's input, learned from one training step's autograd graph."""

    def __init__(self) -> None:
        self.producers: dict[str, str | None] = {}
        self.settled = False
        self._inputs: dict[str, Any] = {}  # name -> grad_fn node, or the input's data_ptr without one
        self._outputs: dict[Any, str] = {}  # grad_fn node or data_ptr of a module's output -> its name

    def observe(self, name: str, inputs: tuple, output: Any) -> None:
        """A watched module ran: remember its first input (first call only) and its output."""
        if name not in self._inputs:
            tensor = next((a for a in inputs if isinstance(a, torch.Tensor)), None)
            self._inputs[name] = _key(tensor) if tensor is not None else None
        if isinstance(output, torch.Tensor):
            self._outputs.setdefault(_key(output), name)

    def settle(self) -> None:
        """The observed step ended: find each input's producer and let go of the graph."""
        if not self._inputs:
            return
        self.producers = {name: self._producer(name, key) for name, key in self._inputs.items()}
        self.settled = True
        self._inputs, self._outputs = {}, {}

    def reset(self) -> None:
        """Learn the flow again (another model, or other layers, were attached)."""
        self.producers, self.settled = {}, False
        self._inputs, self._outputs = {}, {}

    def _producer(self, name: str, key: Any) -> str | None:
        if key is None or isinstance(key, int):
            found = self._outputs.get(key)
            return found if found != name else None
        seen = {key}
        queue = deque([key])
        while queue and len(seen) < _MAX_NODES:
            node = queue.popleft()
            found = self._outputs.get(node)
            if found is not None and found != name:
                return found
            for parent, _ in node.next_functions:
                if parent is not None and parent not in seen:
                    seen.add(parent)
                    queue.append(parent)
        return None


def _key(tensor: torch.Tensor) -> Any:
    """A tensor's autograd node when it has one, else its storage address."""
    return tensor.grad_fn if tensor.grad_fn is not None else tensor.data_ptr()
