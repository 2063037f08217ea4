"""The doctor's recorders: per-layer activation and gradient statistics, without a host sync per step.

Loop-independent: a recorder is attached to a model and fed explicit calls (a batch starts — and whether
it is recorded —, gradients are final, the optimizer stepped, the step ends, a validation phase
starts/ends). The doctor's engine and the standalone ``ActivationStats`` / ``GradientStats`` callbacks
make those calls; whether a training step is recorded is their :class:`~hookscope.doctor.schedule.Cadence`'s
decision, handed to :meth:`ActivationRecorder.begin_batch` as ``recorded``.

Hooks update :class:`~hookscope.hooks.stats.RunningStats` on the device. They are registered only while
a step or a validation phase is recorded (:class:`~hookscope.hooks.handles.SwitchedHooks`): on the 49
steps of 50 the doctor's schedule skips, the model runs without them. At the end of each recorded step
the recorder keeps a device snapshot per layer, and every ``read_every`` recorded steps (or when someone
reads ``history``) all pending snapshots are copied to the host in one transfer (:meth:`flush`, the one
place where a recorder's device statistics reach the host). Everything is keyed by the qualified module
(or parameter) name and by the training step given when the batch started.

History is bounded: when a layer holds more than ``history`` records, every other record is dropped and
``thinnings`` grows by one; a cadence with a fixed interval then doubles it, so the history spans the
whole run at an even density (the adaptive schedule keeps its interval: see
:mod:`hookscope.doctor.schedule`). Checkpoints keep the history thinned further to at most
``SAVED_RECORDS`` records per layer (:mod:`hookscope.doctor.history_codec`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from hookscope.doctor.data_flow import DataFlow
from hookscope.doctor.history_codec import (
    history_from_state,
    history_state,
    params_from_state,
    params_state,
    thin_factor,
    thinned,
)
from hookscope.doctor.record_types import ParamRecord, StepStats
from hookscope.doctor.selection import TrainingOf, with_parameters
from hookscope.hooks.handles import HookSet, SwitchedHooks
from hookscope.hooks.select import Spec, select
from hookscope.hooks.stats import (
    DeviceStats,
    RunningStats,
    TensorStats,
    UpdateRatio,
    read_all,
    reduce_across_ranks,
    whole_norms,
)
from hookscope.hooks.tensors import first_tensor


class LayerRecorder:
    """RunningStats per layer, pending device snapshots, and the bounded host history they become."""

    def __init__(
        self, names: list[str], bins: int, hist_range: tuple[float, float], sample: int | None, max_len: int
    ) -> None:
        self.stats = {name: RunningStats(bins, hist_range, sample) for name in names}
        self.history: dict[str, list[StepStats]] = {name: [] for name in names}
        self.max_len = max_len
        self.pending: list[tuple[str, int, DeviceStats]] = []

    def close_window(self, step: int) -> None:
        """Turn what every layer saw since the last window into pending snapshots keyed by ``step``; under
        torchrun combined over ranks here, where every rank closes the same window (not when they are
        read: rank 0 alone reads them for its trackers)."""
        snaps = [(name, stats.snapshot(reset=True)) for name, stats in self.stats.items()]
        snaps = [(name, snap) for name, snap in snaps if snap is not None]
        reduced = reduce_across_ranks([snap for _, snap in snaps])
        self.pending += [(name, step, snap) for (name, _), snap in zip(snaps, reduced, strict=True)]

    def discard_window(self) -> None:
        for stats in self.stats.values():
            stats.reset()

    def take_pending(self) -> list[tuple[str, int, DeviceStats]]:
        pending, self.pending = self.pending, []
        return pending

    def store(self, pending: list[tuple[str, int, DeviceStats]], stats: list[TensorStats]) -> bool:
        """Append read results to the history; True when a layer overflowed and the history was thinned."""
        for (name, step, _), result in zip(pending, stats, strict=True):
            self.history[name].append(StepStats(step, result))
        return thin_if_full(self.history, self.max_len)

    def load(self, state: dict[str, Any]) -> None:
        """Replace the history with the one :func:`history_state` stored (nothing pending)."""
        self.history = history_from_state(list(self.stats), state)
        self.pending = []


def thin_if_full(history: dict[str, list[Any]], max_len: int) -> bool:
    """Drop every other record of every layer when one holds more than ``max_len``; True if it did."""
    if not any(len(records) > max_len for records in history.values()):
        return False
    for records in history.values():
        del records[1::2]
    return True


def _check_settings(owner: str, history: int, read_every: int) -> None:
    if history < 2 or read_every < 1:
        raise ValueError(
            f"{owner}: history={history}, read_every={read_every}; use history >= 2 and read_every >= 1"
        )


class ActivationRecorder:
    """Statistics of the outputs of the selected layers over training steps and validation phases.

    Records the training steps its feeder says are recorded (``begin_batch(step, True, recorded=True)``);
    validation too when ``include_valid`` (one record per validation phase, in ``valid_history``). See
    :class:`hookscope.callbacks.ActivationStats` for the settings. Fed by :meth:`attach`,
    :meth:`begin_batch`, :meth:`end_batch`, :meth:`begin_valid`, :meth:`end_valid`, :meth:`close` (or
    :meth:`fail`).
    """

    def __init__(
        self,
        select: Spec = with_parameters,
        include_valid: bool = False,
        bins: int = 50,
        range: tuple[float, float] = (-5.0, 5.0),
        sample: int | None = 2048,
        history: int = 1000,
        read_every: int = 100,
        owner: str = "ActivationStats",
    ) -> None:
        _check_settings(owner, history, read_every)
        self.spec, self.include_valid = select, include_valid
        self.bins, self.range, self.sample = bins, range, sample
        self.max_history, self.read_every = history, read_every
        self.thinnings = 0  # how often the training history was halved (a fixed cadence doubles with it)
        self.training_of: TrainingOf = None
        self._hooks = SwitchedHooks()  # on only while something is recorded: a step, a validation phase
        self._recording = False  # this training step is recorded
        self._training = False
        self._in_valid = False
        self._step = 0
        self._train: LayerRecorder | None = None
        self._valid: LayerRecorder | None = None
        self._unread_steps = 0
        self.flow = DataFlow()  # which watched layer feeds which, learned on the first recorded step
        self.version = 0  # grows whenever the host histories change: rules on them need not run again

    @property
    def history(self) -> dict[str, list[StepStats]]:
        """Training records per layer (qualified name), oldest first; reads pending snapshots first."""
        self.flush()
        return self._train.history if self._train is not None else {}

    @property
    def valid_history(self) -> dict[str, list[StepStats]]:
        """One record per validation phase per layer (only with ``include_valid=True``)."""
        self.flush()
        return self._valid.history if self._valid is not None else {}

    def latest(self) -> dict[str, StepStats]:
        """The most recent training record of every layer that has one."""
        return {name: records[-1] for name, records in self.history.items() if records}

    def flush(self) -> None:
        """Copy every pending snapshot to the host in one transfer and append them to the histories."""
        recorders = [r for r in (self._train, self._valid) if r is not None]
        pending = [r.take_pending() for r in recorders]
        snaps = [snap for batch in pending for _, _, snap in batch]
        if not snaps:
            return
        stats, _ = read_all(snaps)
        offset = 0
        for recorder, batch in zip(recorders, pending, strict=True):
            if recorder.store(batch, stats[offset : offset + len(batch)]) and recorder is self._train:
                self.thinnings += 1
            offset += len(batch)
        self._unread_steps = 0
        self.version += 1

    # ---- feed ----------------------------------------------------------------------------------------

    def attach(self, model: nn.Module) -> None:
        """Hook the selected layers; the history continues when the same layers are watched again."""
        layers = select(model, self.spec)
        names = [name for name, _ in layers]
        if self._train is None or list(self._train.stats) != names:
            self._train = self._recorder(names)
            self._valid = self._recorder(names)
            self.thinnings = 0
            self.version += 1
        self.flow.reset()  # the module objects may be new ones: learn the flow again
        self._hooks.targets([(module, self._hook(name)) for name, module in layers])
        self._switch_hooks()

    def begin_batch(self, step: int, training: bool, recorded: bool) -> None:
        """A batch starts: a training batch of optimizer step ``step`` (recorded or not, as the feeder's
        cadence decided), or (``training=False``) another."""
        self._training = training
        if training:
            self._step = step
            self._recording = recorded
            self._switch_hooks()

    def end_batch(self) -> None:
        """The training step ends: its statistics become one pending record."""
        if not self._recording:
            return
        self._hooks.rest()
        assert self._train is not None
        self._train.close_window(self._step)
        if not self.flow.settled:
            self.flow.settle()
        self._recording = False
        self._unread_steps += 1
        if self._unread_steps >= self.read_every:
            self.flush()

    def discard_batch(self) -> None:
        """Forget what this training step recorded (a step that did not happen)."""
        if self._train is not None:
            self._train.discard_window()

    def begin_valid(self) -> None:
        self._in_valid = self.include_valid
        self._training = False
        self._switch_hooks()

    def end_valid(self, step: int) -> None:
        """The validation phase ends: one record, keyed by the training step it followed."""
        if self._in_valid and self._valid is not None:
            self._valid.close_window(step)
        self._in_valid = False
        self._switch_hooks()

    def close(self) -> None:
        """Remove the hooks and read everything pending."""
        self._hooks.clear()
        self._recording = self._in_valid = False
        self.flush()

    def fail(self) -> None:
        """Remove the hooks after an error; the open windows are dropped, the history kept."""
        self._hooks.clear()
        self._recording = self._in_valid = False
        for recorder in (self._train, self._valid):
            if recorder is not None:
                recorder.discard_window()

    # ---- checkpoint state ----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The host histories (pending snapshots read first; thinned to ``SAVED_RECORDS`` per layer) and
        how often the training history was thinned, that thinning included; {} before anything was
        attached."""
        if self._train is None or self._valid is None:
            return {}
        self.flush()
        factor = thin_factor(self._train.history)
        valid = self._valid.history
        return {
            "layers": list(self._train.stats),
            "thinnings": self.thinnings + factor.bit_length() - 1,
            "history": history_state(thinned(self._train.history, factor)),
            "valid_history": history_state(thinned(valid, thin_factor(valid))),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the histories; the next attach continues them when it watches the same layers."""
        names = list(state["layers"])
        self._train, self._valid = self._recorder(names), self._recorder(names)
        self._train.load(state["history"])
        self._valid.load(state["valid_history"])
        self.thinnings = _thinnings(state)
        self._unread_steps = 0
        self.version += 1

    def _recorder(self, names: list[str]) -> LayerRecorder:
        return LayerRecorder(names, self.bins, self.range, self.sample, self.max_history)

    def _switch_hooks(self) -> None:
        """Hooks on while a training step or a validation phase is recorded, off in between. Only the
        start of a step or a phase switches them (not its end), so consecutive recorded steps keep them
        registered (``every=1`` registers them once a phase)."""
        self._hooks.switch(self._recording or self._in_valid)

    def _hook(self, name: str) -> Callable[[nn.Module, Any, Any], None]:
        def record(module: nn.Module, args: Any, output: Any) -> None:
            training = self._training if self.training_of is None else self.training_of(module)
            if training:
                recorder = self._train if self._recording else None
            else:
                recorder = self._valid if self._in_valid else None
            tensor = first_tensor(output) if recorder is not None else None
            if tensor is not None and recorder is not None:
                if not recorder.stats[name].update_if_same_layout(tensor):
                    return  # a module called again on another layout (a shared nn.ReLU): its first is kept
                if training and not self.flow.settled:
                    self.flow.observe(name, args, tensor)

        return record


class GradientRecorder:
    """Gradient norms and update ratios per trainable parameter; optionally output-gradient statistics
    per selected layer (see :class:`hookscope.callbacks.GradientStats` for the settings).

    Fed by :meth:`attach`, :meth:`begin_batch`, :meth:`gradients_ready` (gradients final: unscaled, not
    yet clipped), :meth:`step_done` (the optimizer stepped), :meth:`step_cancelled` or
    :meth:`discard_batch`, :meth:`end_batch`, :meth:`close` (or :meth:`fail`).
    """

    def __init__(
        self,
        select: Spec = with_parameters,
        output_grads: bool = False,
        update_ratio: bool = True,
        bins: int = 50,
        range: tuple[float, float] = (-1e-3, 1e-3),
        sample: int | None = 2048,
        history: int = 1000,
        read_every: int = 100,
        owner: str = "GradientStats",
    ) -> None:
        _check_settings(owner, history, read_every)
        self.spec = select
        self.output_grads, self.update_ratio = output_grads, update_ratio
        self.bins, self.range, self.sample = bins, range, sample
        self.max_history, self.read_every = history, read_every
        self.thinnings = 0  # how often the histories were halved (a fixed cadence doubles with it)
        self.training_of: TrainingOf = None
        self._hooks = SwitchedHooks()  # on only during recorded steps (switched when a step starts)
        self._grad_hooks = HookSet()  # tensor hooks of the current step, removed when it ends
        self._recording = False
        self._training = False
        self._step = 0
        self._layers: LayerRecorder | None = None
        self._param_names: list[str] = []
        self._params: list[nn.Parameter] = []
        self._ratio: UpdateRatio | None = None
        self._param_history: dict[str, list[ParamRecord]] = {}
        self._pending: list[tuple[int, list[bool], torch.Tensor | None, torch.Tensor | None]] = []
        self._step_norms: tuple[list[bool], torch.Tensor | None] | None = None
        self._unread_steps = 0
        # per layer, the last recorded output's first dimension and values per entry of it
        self._shapes: dict[str, tuple[int, int]] = {}
        self.version = 0  # grows whenever the host histories change: rules on them need not run again

    @property
    def history(self) -> dict[str, list[StepStats]]:
        """Output-gradient statistics per layer (qualified name), oldest first."""
        self.flush()
        return self._layers.history if self._layers is not None else {}

    def shared_outputs(self) -> set[str]:
        """Layers whose output is shared by the batch: its first dimension was 1 on the last recorded
        step while another layer's was larger (a position embedding's ``(1, T, d)``, broadcast over the
        batch). Their output gradient sums the examples' gradients."""
        batch = max((leading for leading, _ in self._shapes.values()), default=1)
        return {name for name, (leading, _) in self._shapes.items() if leading == 1 < batch}

    def output_widths(self) -> dict[str, int]:
        """Values per example (per entry of the first dimension) of each layer's output, last recorded."""
        return {name: width for name, (_, width) in self._shapes.items()}

    @property
    def param_history(self) -> dict[str, list[ParamRecord]]:
        """Gradient norm and update ratio per trainable parameter (qualified name), oldest first."""
        self.flush()
        return self._param_history

    def flush(self) -> None:
        """Copy everything pending to the host in one transfer and append it to the histories."""
        layer_pending = self._layers.take_pending() if self._layers is not None else []
        param_pending, self._pending = self._pending, []
        if not layer_pending and not param_pending:
            return
        vectors = [v for _, _, norms, ratios in param_pending for v in (norms, ratios) if v is not None]
        stats, arrays = read_all([snap for _, _, snap in layer_pending], vectors)
        host = iter(arrays)
        thinned_now = self._layers is not None and self._layers.store(layer_pending, stats)
        for step, has_grad, norms, ratios in param_pending:
            norm_values = next(host) if norms is not None else None
            ratio_values = next(host) if ratios is not None else None
            self._store_params(step, has_grad, norm_values, ratio_values)
        thinned_now = thin_if_full(self._param_history, self.max_history) or thinned_now
        if thinned_now:
            self.thinnings += 1
        self._unread_steps = 0
        self.version += 1

    def _store_params(self, step: int, has_grad: list[bool], norms: Any, ratios: Any) -> None:
        norm_iter = iter(norms if norms is not None else ())
        for i, name in enumerate(self._param_names):
            norm = float(next(norm_iter)) if has_grad[i] else None
            ratio = float(ratios[i]) if ratios is not None else None
            self._param_history[name].append(ParamRecord(step, norm, ratio))

    # ---- feed ----------------------------------------------------------------------------------------

    def attach(self, model: nn.Module) -> None:
        """Take the trainable parameters (and hook the selected layers for output gradients); the history
        continues when the model has the same parameters."""
        named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        names = [name for name, _ in named]
        if names != self._param_names:
            self._param_names = names
            self._param_history = {name: [] for name in names}
            self._pending = []
            self.thinnings = 0
            self.version += 1
        self._params = [p for _, p in named]
        self._ratio = UpdateRatio(self._params) if self.update_ratio else None
        self._hooks.clear()
        if not self.output_grads:
            return
        layers = select(model, self.spec)
        layer_names = [name for name, _ in layers]
        if self._layers is None or list(self._layers.stats) != layer_names:
            self._layers = LayerRecorder(layer_names, self.bins, self.range, self.sample, self.max_history)
            self.version += 1
        self._hooks.targets([(module, self._hook(name)) for name, module in layers])
        self._hooks.switch(self._recording)

    def begin_batch(self, step: int, training: bool, recorded: bool) -> None:
        """A batch starts: a training batch of optimizer step ``step`` (recorded or not, as the feeder's
        cadence decided), or (``training=False``) another."""
        self._training = training
        if not training:
            return
        self._step = step
        self._recording = recorded
        self._hooks.switch(self._recording)
        self._step_norms = None

    def gradients_ready(self) -> None:
        """The gradients are final for this step: take their norms (and the weights, for the ratio)."""
        if not self._recording:
            return
        has_grad = [p.grad is not None for p in self._params]
        grads = [p.grad for p in self._params if p.grad is not None]
        norms = whole_norms(grads) if grads else None  # a sharded gradient's: the whole tensor's
        self._step_norms = (has_grad, norms)
        if self._ratio is not None:
            self._ratio.before()

    def step_done(self) -> None:
        """The optimizer stepped: the norms and update ratios become one pending record."""
        if not self._recording or self._step_norms is None:
            return
        has_grad, norms = self._step_norms
        ratios = self._ratio.after() if self._ratio is not None else None
        self._pending.append((self._step, has_grad, norms, ratios))

    def step_cancelled(self) -> None:
        """The step was cancelled after the gradients were read: keep the norms, without a ratio."""
        if self._recording and self._step_norms is not None:
            has_grad, norms = self._step_norms
            self._pending.append((self._step, has_grad, norms, None))
        self._step_norms = None

    def discard_batch(self) -> None:
        """Forget this step's gradients (a step skipped by a grad scaler: they were inf)."""
        self._grad_hooks.remove()
        self._step_norms = None
        if self._layers is not None:
            self._layers.discard_window()

    def end_batch(self) -> None:
        """The training step ends: the output-gradient window becomes one pending record."""
        if not self._recording:
            return
        self._hooks.rest()
        self._grad_hooks.remove()
        if self._layers is not None:
            self._layers.close_window(self._step)
        self._recording = False
        self._step_norms = None
        self._unread_steps += 1
        if self._unread_steps >= self.read_every:
            self.flush()

    def close(self) -> None:
        """Remove the hooks and read everything pending."""
        self._teardown()
        self.flush()

    def fail(self) -> None:
        """Remove the hooks after an error; the open window is dropped, the history kept."""
        self._teardown()
        if self._layers is not None:
            self._layers.discard_window()

    # ---- checkpoint state ----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Parameter (and output-gradient) histories, pending values read first, thinned to
        ``SAVED_RECORDS`` per layer, and how often they were thinned, that thinning included."""
        if not self._param_names and self._layers is None:
            return {}
        self.flush()
        layers = self._layers.history if self._layers is not None else {}
        factor = thin_factor(self._param_history, layers)
        state: dict[str, Any] = {
            "params": list(self._param_names),
            "thinnings": self.thinnings + factor.bit_length() - 1,
            "param_history": params_state(thinned(self._param_history, factor)),
        }
        if self._layers is not None:
            state["layers"] = list(self._layers.stats)
            state["history"] = history_state(thinned(layers, factor))
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the histories; the next attach continues them when the model has the same parameters."""
        self._param_names = list(state["params"])
        self._param_history = {name: [] for name in self._param_names}
        self._param_history.update(params_from_state(state["param_history"]))
        self._pending = []
        self.thinnings = _thinnings(state)
        self._unread_steps = 0
        self.version += 1
        if "layers" in state:
            self._layers = LayerRecorder(
                state["layers"], self.bins, self.range, self.sample, self.max_history
            )
            self._layers.load(state["history"])

    def _teardown(self) -> None:
        self._hooks.clear()
        self._grad_hooks.remove()
        self._recording = False

    def _hook(self, name: str) -> Callable[[nn.Module, Any, Any], None]:
        def watch_grad(module: nn.Module, args: Any, output: Any) -> None:
            training = self._training if self.training_of is None else self.training_of(module)
            if not (self._recording and training):
                return
            tensor = first_tensor(output)
            if tensor is None or not tensor.requires_grad or self._layers is None:
                return
            leading = tensor.shape[0] if tensor.dim() else 1
            self._shapes[name] = (leading, tensor.numel() // max(leading, 1))
            stats = self._layers.stats[name]

            def on_grad(grad: torch.Tensor) -> None:  # None: a tensor hook's return value replaces the grad
                stats.update_if_same_layout(grad)  # a module called again on another layout: left out

            self._grad_hooks.tensor(tensor, on_grad)

        return watch_grad


def _thinnings(state: dict[str, Any]) -> int:
    """How often a saved history was thinned. Older checkpoints saved the recording interval instead
    (``stride``: ``every`` doubled at each thinning), read here as if ``every`` were 1."""
    if "thinnings" in state:
        return int(state["thinnings"])
    return max(int(state.get("stride", 1)), 1).bit_length() - 1
