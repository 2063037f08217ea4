"""What the framework callbacks share: which module to watch, checked options, and whether a step happened."""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from hookscope.hooks.handles import HookSet

if TYPE_CHECKING:
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
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise TypeError(
            f"{owner}: unknown option(s) {', '.join(unknown)}; hs.watch accepts {', '.join(accepted)}"
        )
    return options


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
            while isinstance(getattr(optimizer, "optimizer", None), torch.optim.Optimizer):
                optimizer = optimizer.optimizer
            self._hooks.add(optimizer.register_step_post_hook(self._seen))

    def _seen(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.stepped = True

    def reset(self) -> None:
        self.stepped = False

    def remove(self) -> None:
        self._hooks.remove()


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
