"""The non-finite guard's decision, independent of the loop: is this step's update safe to apply?

Nothing is checked on the host between two steps: each loss and the extremes (min and max) of each watched
module output are kept on the device as 0-d tensors, each finite exactly when what it stands for is.
:meth:`NonFiniteCheck.decide` hands them and every gradient to one fused kernel (the one ``GradScaler``
uses to unscale, at a scale of 1: the values stay as they are) that sets a flag kept on the device when a
value is not finite, and reads the flag to the host in ONE transfer, just before the optimizer step: one
op and a read per step, whatever the number of layers. Only when it is set does it look at which kind
failed.

When it is not, :class:`BatchJournal` names the culprit: it noted each batch since the last good step
with what a replay needs (inputs, torch's RNG state, the autocast dtype), replays them with
:func:`~hookscope.hooks.nonfinite.find_nonfinite` and :func:`stop_message` says it in one paragraph.

What a loop does with a "no" differs: the Learner's ``NonFiniteGuard`` rolls the buffers back and cancels
the fit, ``hs.watch`` raises :class:`~hookscope.watching.NonFiniteError` from the optimizer's step
pre-hook (so the step never runs).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import torch
from torch import nn

from hookscope import compat
from hookscope.hooks.handles import HookSet
from hookscope.hooks.nonfinite import NonFiniteReport, find_nonfinite
from hookscope.hooks.rng import TorchRng, restore_torch_rng, torch_rng
from hookscope.hooks.select import Spec, select
from hookscope.hooks.stats import local_part, local_parts, several_ranks
from hookscope.hooks.tensors import tensors_in

CHECKS = ("activation", "loss", "gradient")
_MAX_VALUES = 4096  # batches that never reach a step (no target): fold the values to keep memory bounded
# What a replay that stayed finite ran, and what the loop adds to it (the suspects then), with the loop's
# loss or with the sum of the outputs standing in for it.
_REPLAYED_WITH_LOSS = (
    "forward, loss and backward",
    "a callback that changes the loss or the gradients, the loss scale",
)
_REPLAYED_WITH_OUTPUTS_SUM = (
    "forward, and a backward of the sum of the outputs",
    "the loss function or the targets, the loss scale, a change to the gradients",
)


class NonFiniteCheck:
    """What the guard kept of the activations and losses since the last step, and the decision at the step.

    ``select`` chooses the modules whose outputs are watched (None: every leaf module; ``False``: none,
    the loss and gradients are still checked). ``training(module)`` says whether a forward trains (only
    those are kept). ``extremes`` and ``losses`` hold 0-d device tensors, each finite exactly when the
    output or loss it comes from is.
    """

    def __init__(self, select: Spec | bool, training: Callable[[nn.Module], bool]) -> None:
        self.select = select
        self.training = training
        self.extremes: list[torch.Tensor] = []
        self.losses: list[torch.Tensor] = []
        self._hooks = HookSet()
        self._flag: _Flag | None = None  # the fused check's flag, on the device of what it checks
        self._fused = True  # the fused check takes these tensors (not sparse ones): tried once per attach

    def attach(self, model: nn.Module) -> None:
        """Hook the selected modules; values and a set flag of an earlier run are dropped."""
        self._hooks.remove()
        self.clear()
        self._flag = None
        self._fused = True
        if self.select is False:
            return
        for _, module in select(model, None if self.select is True else self.select):
            self._hooks.forward(module, self._watch)

    def detach(self) -> None:
        self._hooks.remove()

    def loss(self, loss: torch.Tensor) -> None:
        """Keep one loss (on the device; a loss of several values as their float64 sum, which no finite
        float32 values overflow)."""
        loss = loss.detach()
        self.losses.append(loss if loss.dim() == 0 else loss.double().sum())

    def decide(self, params: Iterable[nn.Parameter], device: torch.device) -> str | None:
        """None when every kept activation and loss and every present gradient is finite (what was kept
        is then cleared); else which kind was not: ``"activation"``, ``"loss"`` or ``"gradient"``.

        The one host read of the guard.
        """
        grads = local_parts([p.grad for p in params if p.grad is not None])  # sharded: this rank's shard
        if several_ranks():
            finite = _all_finite_on_every_rank(self.extremes + self.losses, grads, device)
        else:
            finite = self._all_finite(self.extremes + self.losses, grads)
        if finite:
            self.clear()
            return None
        return _failed_kind(self.extremes, self.losses, device)

    def flag(self, params: Iterable[nn.Parameter], device: torch.device) -> LateVerdict | None:
        """The decision without a host read: the fused check of what was kept and of every present
        gradient sets a flag on ``device`` that stays set once a value was not finite. A fused
        optimizer handed it (:func:`compat.skip_step_if`) leaves this step's update, and every later
        one, out on the device; the returned :class:`LateVerdict` is read at the next step, when the
        device is done with this one. None, with nothing done, under torchrun or where the fused check
        does not take these tensors (sparse gradients): :meth:`decide` then."""
        if several_ranks() or not self._fused:
            return None
        tensors = [*self.extremes, *self.losses, *local_parts([p.grad for p in params if p.grad is not None])]
        flag = self._flag_on(device)
        if tensors:
            self._fused = compat.flag_non_finite_(tensors, flag.found, flag.one)
            if not self._fused:
                return None
        flag.send()
        verdict = LateVerdict(flag, self.extremes, self.losses)
        self.clear()
        return verdict

    def clear(self) -> None:
        self.extremes, self.losses = [], []

    def state_dict(self) -> dict[str, list[torch.Tensor]]:
        """Whether what was kept so far is finite, one flag per kind on the device (a checkpoint inside
        an unchecked group)."""
        return {
            "activation_ok": [_finite(self.extremes, None)] if self.extremes else [],
            "loss_ok": [_finite(self.losses, None)] if self.losses else [],
        }

    def load_state_dict(self, state: dict[str, Any], device: torch.device) -> None:
        self.extremes = [_stand_in(flag.to(device)) for flag in state["activation_ok"]]
        self.losses = [_stand_in(flag.to(device)) for flag in state["loss_ok"]]

    def _all_finite(self, values: list[torch.Tensor], grads: list[torch.Tensor]) -> bool:
        """Whether the 0-d ``values`` and every value of ``grads`` are finite, in one read: one fused
        kernel sets a flag kept on their device when a value is NaN or infinite (inside a training step
        each small op costs 20-80 us on a CPU, so there is one, the read included: a CPU flag is read
        through numpy). A layout the fused check does not take (sparse gradients) gets :func:`_largest`."""
        tensors = [*values, *grads]
        if not tensors:
            return True
        if self._fused:  # a refusal is remembered: it would raise again at every step
            flag = self._flag_on(tensors[0].device)
            self._fused = compat.flag_non_finite_(tensors, flag.found, flag.one)
            if self._fused:
                return flag.clear_if_set()
        return _every_finite(tensors)

    def _flag_on(self, device: torch.device) -> _Flag:
        """The flag on ``device``, made once (a new tensor every step would be one more op)."""
        if self._flag is None or self._flag.found.device != device:
            self._flag = _Flag(device)
        return self._flag

    def _watch(self, module: nn.Module, args: Any, output: Any) -> None:
        if not self.training(module):
            return
        for t in tensors_in(output):
            if t.is_floating_point() and t.numel():
                self.extremes.extend(torch.aminmax(t.detach()))
        if len(self.extremes) > _MAX_VALUES:
            self.extremes = [_stand_in(_finite(self.extremes, None))]


class LateVerdict(NamedTuple):
    """A step's flag on its way to the host (:meth:`NonFiniteCheck.flag`), and what its step kept, to
    say which kind failed."""

    flag: _Flag
    extremes: list[torch.Tensor]
    losses: list[torch.Tensor]

    def failed(self) -> bool:
        """Whether a value of the step, or of one before it, was not finite. Read after the next step's
        work is queued, the device is then done with this one: no wait, or a short one."""
        return self.flag.received() != 0

    def reason(self) -> str:
        """Which kind failed first: the activations and losses were kept; a failure that is in neither
        is in the gradients."""
        return _failed_kind(self.extremes, self.losses, self.flag.found.device)


class _Batch(NamedTuple):
    """One noted forward: how the model was called, the targets of its loss, and the state it ran in."""

    args: tuple
    kwargs: dict[str, Any]
    targets: tuple
    rng: TorchRng
    autocast: torch.dtype | None


class BatchJournal:
    """The batches since the last good step, each with what a faithful replay needs, and the replay.

    :meth:`record` notes a batch just before its forward: the inputs (kept by reference: the loop does
    not change them), torch's RNG state (so the replay draws the same dropout masks) and the autocast
    dtype on ``device`` (a float16 overflow only happens under it). :meth:`blame` replays them in order
    with :func:`~hookscope.hooks.nonfinite.find_nonfinite` until one is found. Several batches with
    gradient accumulation: the step checks its whole group.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.batches: list[_Batch] = []

    def record(self, args: tuple, kwargs: dict[str, Any] | None = None, targets: tuple = ()) -> None:
        """Note a forward about to run as ``model(*args, **kwargs)``, whose loss takes ``targets``."""
        autocast = _autocast_dtype(self.device)
        self.batches.append(_Batch(tuple(args), dict(kwargs or {}), tuple(targets), torch_rng(), autocast))

    def clear(self) -> None:
        """The step was checked (or skipped): forget its batches."""
        self.batches = []

    def blame(self, model: nn.Module, loss_func: Callable[..., torch.Tensor] | None) -> NonFiniteReport:
        """The first non-finite value of the noted batches, each replayed from its own RNG state and under
        its autocast. ``loss_func(pred, *targets)`` is the loop's loss; None when the loop's loss is
        unknown (``hs.watch``): the sum of the outputs stands in, so the backward is replayed too. A
        forward called with both positional and keyword inputs cannot be replayed and is passed over. A
        model with sharded parameters under torchrun is not replayed: nothing is found."""
        report = NonFiniteReport(found=False)
        if several_ranks() and any(local_part(p) is not p for p in model.parameters()):
            return report  # sharded (FSDP2): each replayed forward is collective, and ranks stop apart
        loss = loss_func if loss_func is not None else outputs_sum
        for batch in self.batches:
            if batch.args and batch.kwargs:
                continue
            restore_torch_rng(batch.rng)
            autocast = (
                torch.autocast(self.device.type, dtype=batch.autocast)
                if batch.autocast is not None
                else contextlib.nullcontext()
            )
            with autocast:
                report = find_nonfinite(model, batch.kwargs or batch.args, loss, batch.targets)
            if report.found:
                return report
        return report


def reads_late(
    opt: torch.optim.Optimizer | None, late: bool | None, device: torch.device, refusal: str
) -> bool:
    """Whether a guard hands its flag to ``opt`` and reads it a step late: with ``late`` None where ``opt``
    can skip a step on the device (:func:`compat.skips_steps_on_device`) and ``device`` is not the CPU
    (where a read before the step is free), with True wherever ``opt`` can (a ValueError saying
    ``refusal`` where it cannot), with False never."""
    can = opt is not None and compat.skips_steps_on_device(opt)
    if late and not can:
        raise ValueError(refusal)
    return can and (bool(late) or (late is None and device.type != "cpu"))


def stop_message(stopped: str, step: int, reason: str, report: NonFiniteReport, with_loss: bool) -> str:
    """One paragraph after a guard's stop: ``stopped`` says who stopped where ("hs.watch stopped optimizer
    step 3"), then which check failed, which weights the model keeps, and the blame. ``with_loss``: the
    replay ran the loop's loss (else the sum of the outputs stood in for it), which narrows the suspects
    when the replay stays finite."""
    blame = str(report)
    if not report.found:
        replay, adds = _REPLAYED_WITH_LOSS if with_loss else _REPLAYED_WITH_OUTPUTS_SUM
        blame = (
            f"Replayed alone ({replay} under the same autocast, no callbacks, no loss scaling), the batch "
            f"stays finite: the fault comes from what the loop adds — {adds} — so try again without them "
            "to narrow it down."
        )
    return (
        f"{stopped}: the first non-finite value was in the {reason}. The update of that step was not "
        f"applied, so the model keeps the weights of step {step}. {blame}"
    )


def outputs_sum(pred: Any) -> torch.Tensor:
    """A stand-in loss for a replay whose loop's loss is unknown: the sum of every floating output."""
    tensors = [t.float().sum() for t in tensors_in(pred) if t.is_floating_point()]
    return torch.stack(tensors).sum()


def _autocast_dtype(device: torch.device) -> torch.dtype | None:
    """The autocast dtype a forward on ``device`` runs under now (None outside autocast)."""
    return torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else None


def _zero_if_finite(values: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """A new float32 0-d tensor on ``device``: 0 when every 0-d value is finite, NaN when one is not. Each
    value times 0 is NaN exactly when it is NaN or infinite; the product comes before the sum and the
    cast, so no large finite value can overflow them."""
    if not values:
        return torch.zeros((), device=device)
    if len(values) == 1:
        return values[0].mul(0).float().to(device)
    return torch.stack(values).mul(0).sum(dtype=torch.float32).to(device)


class _Flag:
    """A float32 0 on ``device`` that :func:`compat.flag_non_finite_` sets to 1 (with ``one``, its scale),
    and its readers: on the CPU a numpy view (no torch op); on a GPU ``item`` (a host sync), or, for a
    late read, a copy into pinned host memory sent without blocking and an event that says it arrived."""

    def __init__(self, device: torch.device) -> None:
        self.found = torch.zeros((), device=device)
        self.one = torch.ones((), device=device)
        on_cpu, on_cuda = device.type == "cpu", device.type == "cuda"
        self._read = self.found.numpy().item if on_cpu else self.found.item
        self._host = None if on_cpu else torch.zeros((), pin_memory=on_cuda)
        # on other accelerators the copy blocks: without an event, an unfinished copy cannot be told
        self._sent = torch.Event(device) if on_cuda else None

    def send(self) -> None:
        """Start the flag's way to the host (nothing to do on the CPU)."""
        if self._host is None:
            return
        self._host.copy_(self.found, non_blocking=self._sent is not None)
        if self._sent is not None:
            self._sent.record()

    def received(self) -> float:
        """The flag as :meth:`send` sent it, waiting for the copy only if it has not arrived."""
        if self._host is None:
            return self._read()
        if self._sent is not None and not self._sent.query():
            self._sent.synchronize()
        return float(self._host.numpy())

    def clear_if_set(self) -> bool:
        """Whether the flag is still 0 (nothing non-finite); a set flag is cleared for the next check."""
        if self._read() == 0:
            return True
        self.found.zero_()
        return False


def _failed_kind(extremes: list[torch.Tensor], losses: list[torch.Tensor], device: torch.device) -> str:
    """After a failed check: ``"activation"`` or ``"loss"`` when one of those kept values was not finite
    (on any rank), else ``"gradient"``, the only other values the check read."""
    oks = torch.stack([_finite(kind, device) for kind in (extremes, losses)])
    failed = (~_on_every_rank(oks)).nonzero()
    return CHECKS[int(failed[0])] if len(failed) else "gradient"


def _every_finite(tensors: list[torch.Tensor]) -> bool:
    """Whether every value of ``tensors`` (any layout, on any devices) is finite, from the largest
    magnitude of each: one read per device."""
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for largest in _largest(tensors):
        by_device.setdefault(largest.device, []).append(largest)
    return all(math.isfinite(v) for group in by_device.values() for v in torch.stack(group).tolist())


def _all_finite_on_every_rank(
    values: list[torch.Tensor], grads: list[torch.Tensor], device: torch.device
) -> bool:
    """Whether the 0-d ``values`` and every value of ``grads`` are finite on every rank: this rank's flag
    (:func:`_zero_if_finite`) plus the float64 sum of the gradients' largest magnitudes (:func:`_largest`;
    no finite float32 values overflow it), added over the ranks on the device before the one read."""
    total = _zero_if_finite(values, device).double()
    if grads:
        total = total + torch.stack(_largest(grads)).sum(dtype=torch.float64)
    torch.distributed.all_reduce(total)
    return math.isfinite(total.item())


def _largest(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """The largest magnitude of each tensor, in one fused kernel, sparse ones included: NaN or inf exactly
    when a value is (a 2-norm's squares would overflow to inf from values of about 1e19)."""
    return compat.foreach_norm(tensors, ord=math.inf)


def _finite(values: list[torch.Tensor], device: torch.device | None) -> torch.Tensor:
    """One device flag: every value is finite (True for none)."""
    if not values:
        return torch.ones((), dtype=torch.bool, device=device)
    return torch.stack(values).isfinite().all()


def _stand_in(ok: torch.Tensor) -> torch.Tensor:
    """A 0-d float that is finite exactly when ``ok``: a folded flag, kept among the values."""
    return torch.where(ok, 0.0, torch.nan)


def _on_every_rank(ok: torch.Tensor) -> torch.Tensor:
    """The flags ``ok`` on the host; under torchrun each is passed only if it passed on every rank (one
    all-reduce on the device before the one read), so every rank stops at the same step — a rank left
    waiting in the next step's gradient all-reduce would hang."""
    if several_ranks():
        as_int = ok.to(torch.uint8)
        torch.distributed.all_reduce(as_int, op=torch.distributed.ReduceOp.MIN)
        ok = as_int.bool()
    return ok.cpu()
