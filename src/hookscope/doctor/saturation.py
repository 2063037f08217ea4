"""The saturation recorder: how much of each tanh/sigmoid layer's output sits at its flat ends.

A recorder beside :mod:`hookscope.doctor.recorders`, with the same feed (:meth:`~SaturationRecorder.attach`,
``begin_batch(step, training, recorded)``, ``end_batch``, ``discard_batch``, ``close``, ``fail``) and the
same bounded history: one share per layer per recorded step, every other one dropped when a layer holds
more than ``history`` (``thinnings`` counts it). The hooks are registered only during recorded training
steps. The shares stay on the device until the engine reads them, in the one transfer of its check
(:meth:`~SaturationRecorder.take_pending` / :meth:`~SaturationRecorder.store`), together with the losses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from hookscope.doctor.history_codec import series_from_state, series_state, thin_factor, thinned
from hookscope.doctor.recorders import thin_if_full
from hookscope.doctor.selection import TrainingOf
from hookscope.hooks.handles import SwitchedHooks

SATURATING = {nn.Tanh: "tanh", nn.Sigmoid: "sigmoid", nn.Hardtanh: "tanh", nn.Softsign: "tanh"}


class SaturationRecorder:
    """Per tanh/sigmoid layer: the share of outputs within ``margin`` of the ends of its range, one
    ``(step, share)`` per recorded training step in ``history`` (at most ``max_history`` per layer)."""

    def __init__(self, margin: float, history: int = 1000) -> None:
        self.margin, self.max_history = margin, history
        self.kinds: dict[str, str] = {}  # layer -> "tanh" | "sigmoid"
        self.history: dict[str, list[tuple[int, float]]] = {}
        self.thinnings = 0
        self.version = 0  # grows whenever the history changes: rules on it need not run again
        self.training_of: TrainingOf = None
        self._hooks = SwitchedHooks()  # on only during recorded training steps (switched when one starts)
        self._recording = self._training = False
        self._step = 0
        self._window: dict[str, list[torch.Tensor]] = {}
        self._pending: list[tuple[str, int, torch.Tensor]] = []

    def attach(self, model: nn.Module) -> None:
        """Hook the saturating layers of ``model``; the history of a layer already watched continues."""
        hooks = []
        for name, module in model.named_modules():
            kind = next((k for t, k in SATURATING.items() if isinstance(module, t)), None)
            if kind is None:
                continue
            self.kinds[name] = kind
            self._window.setdefault(name, [])
            self.history.setdefault(name, [])
            hooks.append((module, self._hook(name, kind)))
        self._training = False
        self._hooks.targets(hooks)
        self._hooks.switch(self._recording)

    def begin_batch(self, step: int, training: bool, recorded: bool) -> None:
        """A batch starts; the hooks are on for a recorded training step."""
        self._training = training
        if training:
            self._step, self._recording = step, recorded
            self._hooks.switch(recorded)

    def end_batch(self) -> None:
        """Fold this step's shares into one device scalar per layer, keyed by the step."""
        if not self._recording:
            return
        self._hooks.rest()
        for name, values in self._window.items():
            if values:
                self._pending.append((name, self._step, torch.stack(values).mean()))
                self._window[name] = []

    def discard_batch(self) -> None:
        """Forget this step's shares (a step that did not happen)."""
        for name in self._window:
            self._window[name] = []

    def close(self) -> None:
        self._hooks.clear()
        self._recording = False

    def fail(self) -> None:
        self.close()
        self.discard_batch()

    def take_pending(self) -> list[tuple[str, int, torch.Tensor]]:
        """The shares not read yet, as device scalars; the caller reads them and calls :meth:`store`."""
        pending, self._pending = self._pending, []
        return pending

    def store(self, pending: list[tuple[str, int, torch.Tensor]], shares: list[Any]) -> None:
        """Append the host values of ``pending`` (in its order) to the history, thinned when full."""
        for (name, step, _), share in zip(pending, shares, strict=True):
            self.history[name].append((step, float(share)))
        if pending:
            self.version += 1
        while thin_if_full(self.history, self.max_history):
            self.thinnings += 1

    def state_dict(self) -> dict[str, Any]:
        """The history, thinned to ``SAVED_RECORDS`` per layer, and how often it was thinned."""
        factor = thin_factor(self.history)
        saved = thinned(self.history, factor)
        return {
            "history": {name: series_state(series) for name, series in saved.items()},
            "thinnings": self.thinnings + factor.bit_length() - 1,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history = {name: series_from_state(series) for name, series in state["history"].items()}
        self.thinnings = int(state.get("thinnings", 0))
        self._pending = []
        self.version += 1

    def _hook(self, name: str, kind: str) -> Callable[[nn.Module, Any, Any], None]:
        margin = self.margin
        low, high = (-1.0 + margin, 1.0 - margin) if kind == "tanh" else (margin, 1.0 - margin)

        def hook(module: nn.Module, args: Any, output: Any) -> None:
            training = self._training if self.training_of is None else self.training_of(module)
            if training and self._recording and isinstance(output, torch.Tensor):
                out = output.detach()
                self._window[name].append(((out <= low) | (out >= high)).float().mean())

        return hook
