"""What the framework callbacks share: :class:`WatchCallback` (a Watch built from checked options over the
user's model, fed the step's outcome, closed at the end), which module to watch, and whether a step
happened. Each integration keeps only its framework's mapping of events to these calls."""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from hookscope.doctor.guard import reads_late
from hookscope.hooks.handles import HookSet
from hookscope.hooks.tensors import model_device

if TYPE_CHECKING:
    from hookscope.doctor.findings import Finding
    from hookscope.watching import Watch

INSTALL_HINT = "pip install 'hookscope[integrations]'"


def missing_framework(module: str, framework: str) -> ImportError:
    """The error an integration module raises when its framework is not installed."""
    return ImportError(f"{module} needs {framework}, which is not installed: {INSTALL_HINT}")


def user_model(wrapper: nn.Module, model: nn.Module | None = None) -> nn.Module:
    """The module whose layers are watched and named in findings.

    ``model`` when given. Otherwise, when the framework's wrapper (a ``LightningModule``, an adapter that
    adds the loss for Hugging Face's Trainer, ``DistributedDataParallel``) holds no parameter of its own and
    exactly one child holds them all, that child: findings then name ``0`` or ``conv1`` as the Learner's do,
    not ``model.0``. Else the wrapper itself (a Hugging Face model is its own user model).
    """
    if model is not None:
        return model
    holders = [child for child in wrapper.children() if next(child.parameters(), None) is not None]
    if len(holders) != 1 or next(wrapper.parameters(recurse=False), None) is not None:
        return wrapper
    return holders[0]


def watch_options(owner: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` checked against ``hs.watch``'s keyword options now, when the callback is made, rather
    than at the first step of a fit."""
    from hookscope.watching import Watch

    parameters = inspect.signature(Watch).parameters.items()
    accepted = [name for name, p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY]
    unknown = sorted(set(options) - set(accepted) - set(Watch.__init__.renamed_keywords))
    if unknown:
        raise TypeError(
            f"{owner}: unknown option(s) {', '.join(unknown)}; hs.watch accepts {', '.join(accepted)}"
        )
    return options


def innermost(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer inside a framework's wrappers (``.optimizer`` of Lightning's, Accelerate's;
    ``.opt`` of fastai's ``OptimWrapper``)."""
    while True:
        inner = getattr(optimizer, "optimizer", None)
        if not isinstance(inner, torch.optim.Optimizer):
            inner = getattr(optimizer, "opt", None)
        if not isinstance(inner, torch.optim.Optimizer):
            return optimizer
        optimizer = inner


class StepSeen:
    """Whether the optimizer really stepped since :meth:`reset`: a step post-hook on each torch optimizer.

    A ``GradScaler`` skips ``optimizer.step()`` when the scaled gradients are not finite, and the frameworks
    call the optimizer through wrappers (Lightning's closure, Accelerate's ``AcceleratedOptimizer``): the
    post-hook on the innermost ``torch.optim.Optimizer`` fires exactly when the weights changed.
    """

    def __init__(self) -> None:
        self.stepped = False
        self._hooks = HookSet()

    def attach(self, optimizers: Iterable[Any]) -> None:
        """Hook every optimizer of ``optimizers`` (wrappers are unwrapped through ``.optimizer``)."""
        for optimizer in optimizers:
            self._hooks.add(innermost(optimizer).register_step_post_hook(self._seen))

    def _seen(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.stepped = True

    def reset(self) -> None:
        self.stepped = False

    def remove(self) -> None:
        self._hooks.remove()


class WatchCallback:
    """The part of a framework's ``HookscopeCallback`` that is the same in every framework; mixed in before
    the framework's callback class, which gives the events.

    ``options`` are ``hs.watch``'s, checked when the callback is made. :meth:`_start` opens a Watch at the
    start of a fit (closing an earlier one: a framework that fires no event when a fit raises leaves it
    open), :meth:`_gradients_ready` reads the gradients once per optimizer step, :meth:`_step_ended`
    tells a real step from one a ``GradScaler`` skipped, :meth:`close` runs the last check.
    """

    def __init__(self, **options: Any) -> None:
        self.options = watch_options(type(self).__name__, options)
        self.watch: Watch | None = None
        self._steps = StepSeen()

    @property
    def findings(self) -> list[Finding]:
        """The findings of the latest fit (empty before one)."""
        return [] if self.watch is None else self.watch.findings

    def _start(
        self,
        wrapper: nn.Module,
        model: nn.Module | None,
        optimizers: Iterable[Any] | None = None,
        loader: Any = None,
    ) -> Watch:
        """A new Watch over the user's model inside the framework's ``wrapper`` (``model`` when the user
        chose it, see :func:`user_model`); ``optimizers`` are hooked to see whether each step happened,
        and with ``guard=True`` the first takes the guard's verdict to read a step late where it can
        (``late``, as for ``hs.watch``); ``loader``, the framework's training loader, has its settings
        named by ``input_bound``."""
        from hookscope.watching import watch

        self.close()
        watched = user_model(wrapper, model)
        optimizers = [] if optimizers is None else list(optimizers)
        # the first: a GAN's other optimizers step other parameters
        first = innermost(optimizers[0]) if optimizers else None
        options = dict(self.options)
        # decided before a Watch opens: a refusal leaves nothing open
        late = self._reads_late(first, options.pop("late", None), model_device(watched))
        self.watch = watch(watched, **options)
        self.watch.watch_loader(loader)
        self._steps.attach(optimizers)
        if first is not None:
            self.watch.follow_optimizer(first, late=late)
        return self.watch

    def _reads_late(
        self, optimizer: torch.optim.Optimizer | None, late: bool | None, device: torch.device
    ) -> bool:
        """Whether the guard (when on) reads a step late: :func:`hookscope.doctor.guard.reads_late`, its
        refusal naming this callback."""
        if not self.options.get("guard"):
            return False
        name = type(optimizer).__name__ if optimizer is not None else "no optimizer"
        refusal = (
            f"{type(self).__name__}(late=True): {name} cannot skip a step on the device; return a fused "
            "optimizer (e.g. torch.optim.AdamW(params, fused=True)) or leave late=None"
        )
        return reads_late(optimizer, late, device, refusal)

    def _log(self, loss: torch.Tensor, target: Any = None) -> None:
        """This training batch's loss, to the loss rules, and its target, to the label mix (on the
        device)."""
        if self.watch is not None:
            self.watch.log(loss.detach(), target=target)

    def _plan(self, total_steps: int | None, batches_per_epoch: int | None, schedulers: Any) -> None:
        """What the framework knows of the run ahead (see :meth:`hookscope.watching.Watch.plan_run`)."""
        if self.watch is not None:
            self.watch.plan_run(total_steps, batches_per_epoch, schedulers)

    def _gradients_ready(self) -> None:
        """The gradients of this optimizer step are final (unscaled): read and check them."""
        if self.watch is None:
            return
        self.watch.gradients_ready()
        self._steps.reset()

    def _step_ended(self) -> None:
        """The framework's optimizer step is over: close it if the optimizer stepped, else forget it."""
        if self.watch is None:
            return
        if self._steps.stepped:
            self.watch.step_done()
        else:
            self.watch.skip_step()

    def close(self) -> None:
        """Run the last check and remove every hook (idempotent; the end of a fit calls it)."""
        self._steps.remove()
        if self.watch is not None:
            self.watch.close()


# Keys of a dict batch that hold its target.
TARGET_KEYS = ("labels", "label", "target", "targets", "y")


def batch_target(batch: Any) -> Any:
    """The target of a framework's batch: the last of an ``(inputs..., target)`` tuple or list, the
    ``labels``/``label``/``target``/``y`` entry of a dict; None when it has none (the label check is
    then skipped)."""
    if isinstance(batch, tuple | list) and len(batch) >= 2:
        return batch[-1]
    if isinstance(batch, Mapping):
        return next((batch[key] for key in TARGET_KEYS if key in batch), None)
    return None


def scalars(watch: Watch) -> dict[str, float]:
    """A few numbers a tracker can plot, from the host histories the watch's last check filled: findings
    per kind, the largest |activation| and |output gradient| of the latest record and its non-finite count."""
    metrics = {"hookscope/findings": float(len(watch.findings))}
    for finding in watch.findings:
        key = f"hookscope/findings/{finding.kind}"
        metrics[key] = metrics.get(key, 0.0) + 1.0
    nonfinite = 0
    for label, history in (("activation", watch.activations), ("gradient", watch.gradients)):
        latest = [records[-1].stats for records in history.values() if records]
        if latest:
            metrics[f"hookscope/{label}_abs_max"] = max(s.abs_max for s in latest)
            nonfinite += sum(s.nonfinite for s in latest)
    metrics["hookscope/nonfinite"] = float(nonfinite)
    return metrics
