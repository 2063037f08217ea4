"""The loss checks: which family the loss function is and what chance gives for it, ``init_loss`` (the
loss at initialisation far above chance) and ``cannot_overfit`` (a copy that cannot fit one small batch),
Karpathy's "verify the loss at init" and "overfit one batch"."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from hookscope.doctor.findings import Finding
from hookscope.doctor.preflight.probe import finding

# init_loss: the loss at initialisation above this multiple of what chance gives.
INIT_LOSS_FACTOR = {"classification": 2.0, "regression": 3.0}
# cannot_overfit: OVERFIT_SAMPLES samples, at most OVERFIT_STEPS steps, must bring the loss below
# OVERFIT_FRACTION of chance (above the loss's own floor, e.g. with label smoothing).
OVERFIT_SAMPLES, OVERFIT_STEPS, OVERFIT_FRACTION, OVERFIT_LR = 16, 300, 0.1, 1e-3
# A loss that missed the goal but fell below OVERFIT_PROGRESS of its start learns slowly (a warning);
# one that did not, or went non-finite, points to a bug (an error).
OVERFIT_PROGRESS = 0.5

_LOSS_KINDS: dict[Any, str] = {
    nn.CrossEntropyLoss: "multiclass",
    F.cross_entropy: "multiclass",
    nn.NLLLoss: "nll",
    F.nll_loss: "nll",
    nn.BCEWithLogitsLoss: "binary_logits",
    F.binary_cross_entropy_with_logits: "binary_logits",
    nn.BCELoss: "binary_probs",
    F.binary_cross_entropy: "binary_probs",
    nn.MSELoss: "mse",
    F.mse_loss: "mse",
    nn.L1Loss: "l1",
    F.l1_loss: "l1",
    nn.SmoothL1Loss: "regression",
    F.smooth_l1_loss: "regression",
    nn.HuberLoss: "regression",
    F.huber_loss: "regression",
}
CLASSIFICATION = ("multiclass", "nll", "binary_logits", "binary_probs")
REGRESSION = ("mse", "l1", "regression")


def loss_kind(loss_func: Any) -> str | None:
    """Which loss family ``loss_func`` is (an nn loss module or its functional form), or None."""
    kind = _LOSS_KINDS.get(type(loss_func))
    if kind is None:
        try:
            kind = _LOSS_KINDS.get(loss_func)
        except TypeError:  # unhashable callable
            return None
    if kind is not None and getattr(loss_func, "reduction", "mean") != "mean":
        return None  # the chance values below are per-sample means
    return kind


def chance_loss(
    kind: str, loss_func: Any, out: torch.Tensor, target: torch.Tensor
) -> tuple[float | None, float]:
    """What the loss is for a model that knows nothing (uniform scores; the targets' mean or median), and
    the smallest loss it can reach (above 0 with label smoothing)."""
    y = target.detach().float()
    if kind in ("multiclass", "nll"):
        classes = out.shape[1] if out.dim() >= 2 else 1
        eps = float(getattr(loss_func, "label_smoothing", 0.0)) if kind == "multiclass" else 0.0
        return math.log(classes), _smoothed_entropy(eps, classes)
    if kind in ("binary_logits", "binary_probs"):
        return math.log(2), 0.0
    if kind == "mse":
        return float(y.var(unbiased=False)), 0.0
    if kind == "l1":
        return float((y - y.median()).abs().mean()), 0.0
    return None, 0.0


def _smoothed_entropy(eps: float, classes: int) -> float:
    """The entropy of a one-hot target smoothed by ``eps``: cross-entropy's lowest value."""
    if eps <= 0 or classes < 2:
        return 0.0
    high, low = 1 - eps + eps / classes, eps / classes
    return -(high * math.log(high) + (classes - 1) * low * math.log(low))


def init_loss(
    kind: str, start: float, chance: float | None, out: torch.Tensor, target: torch.Tensor, last: str
) -> list[Finding]:
    """The loss at initialisation far above what chance (or predicting the mean) gives."""
    if chance is None or chance <= 0 or not math.isfinite(start):
        return []
    family = "classification" if kind in CLASSIFICATION else "regression"
    ratio = start / chance
    if ratio <= INIT_LOSS_FACTOR[family]:
        return []
    values = out.detach().float()
    evidence = {"loss": start, "expected": chance, "ratio": ratio, "output_std": float(values.std())}
    if family == "classification":
        cause = (
            f"the scores start large (std {evidence['output_std']:.3g}), so the model is confidently wrong: "
            f"initialise `{last}` with small weights (e.g. nn.init.normal_(w, std=0.01)) and a zero bias"
        )
    else:
        mean = float(target.float().mean())
        evidence["target_mean"] = mean
        cause = (
            f"the targets' mean is {mean:.3g} and the outputs start near {float(values.mean()):.3g}: set "
            f"`{last}`'s bias to the targets' mean, or standardise the targets"
        )
    return [
        finding(
            "init_loss",
            last,
            "warning",
            f"the loss at initialisation is {start:.4g}, {ratio:.1f}x the {chance:.4g} that chance "
            f"gives; {cause}",
            evidence,
        )
    ]


def cannot_overfit(
    net: nn.Module,
    inputs: tuple,
    target: torch.Tensor,
    loss_func: Callable[..., torch.Tensor],
    opt_func: Callable[..., torch.optim.Optimizer] | None,
    lr: float,
    steps: int,
    reference: float,
    floor: float,
) -> list[Finding]:
    """Train on one small batch; a model that cannot drive its loss near zero there has a bug (or, when
    the loss falls but too slowly, a learning rate or a start to fix)."""
    if not math.isfinite(reference) or reference <= floor:
        return []
    goal = floor + OVERFIT_FRACTION * (reference - floor)
    opt = (opt_func or torch.optim.Adam)([p for p in net.parameters() if p.requires_grad], lr=lr)
    losses: list[torch.Tensor] = []
    for step in range(1, steps + 1):
        opt.zero_grad(set_to_none=True)
        loss = loss_func(net(*inputs), target)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
        if step % 10 and step != steps:
            continue
        last = float(losses[-1])
        if not math.isfinite(last) or last <= goal:
            break
    history = torch.stack(losses).float()
    last, best = float(history[-1]), float(history.nan_to_num(math.inf).min())
    if math.isfinite(last) and last <= goal:
        return []
    falling = math.isfinite(last) and best < OVERFIT_PROGRESS * float(history[0])
    if not math.isfinite(last):
        cause = "the loss became NaN/Inf: lower the learning rate"
    elif falling:
        cause = "the loss falls, too slowly: raise the learning rate, or fix a poor start (see init_loss)"
    else:
        cause = (
            "check that inputs and targets are paired, that every layer gets gradient (nothing detached "
            "or frozen), the learning rate, and regularisation (dropout, weight decay) against memorising"
        )
    return [
        finding(
            "cannot_overfit",
            "",
            "warning" if falling else "error",
            f"the model cannot fit one batch of {len(target)} samples: after {len(losses)} steps at lr "
            f"{lr:g} the loss is {last:.4g} (best {best:.4g}, start {float(history[0]):.4g}, goal "
            f"{goal:.4g}); {cause}",
            {
                "samples": len(target),
                "steps": len(losses),
                "lr": lr,
                "start": float(history[0]),
                "best": best,
                "last": last,
                "goal": goal,
            },
        )
    ]
