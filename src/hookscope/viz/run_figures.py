"""Every figure of a run folder, drawn from a Learner after (or during) a fit.

The :class:`~hookscope.callbacks.RunFolder` callback calls :func:`write_run_figures`; the names of the
files decide where the report places them (see :mod:`hookscope.viz.report`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from hookscope.doctor.findings import ranked
from hookscope.doctor.recorders import ActivationRecorder, GradientRecorder
from hookscope.hooks.capture import capture
from hookscope.viz.curves import loss_curves, lr_schedule
from hookscope.viz.evidence import write_finding_figures
from hookscope.viz.feature_maps import feature_maps
from hookscope.viz.plots import activation_curves, colorful_dimension, gradient_flow
from hookscope.viz.save import save_figure

if TYPE_CHECKING:
    from hookscope.train.learner import Learner

# Where dead or saturated units show: the outputs of the nonlinearities.
ACTIVATIONS = (nn.ReLU, nn.LeakyReLU, nn.GELU, nn.SiLU, nn.ELU, nn.Tanh, nn.Sigmoid, nn.ReLU6, nn.Hardswish)
MAX_CURVES = 12  # layers drawn in the activation curves
MAX_COLORFUL = 4  # colorful-dimension images: one per layer, the first few watched layers
FEATURE_MAP_LAYERS = 2  # the first conv layers, drawn on one validation sample


def write_run_figures(
    learn: Learner,
    path: Callable[[str], Path],
    activations: ActivationRecorder | None = None,
    gradients: GradientRecorder | None = None,
    sample: tuple | None = None,
) -> None:
    """Draw the loss and lr curves, the statistics of ``activations`` / ``gradients`` (when recorded), the
    evidence of each doctor finding (:mod:`hookscope.viz.evidence`) and the feature maps of the first
    conv layers on ``sample`` (the model's inputs for one example, as a tuple); ``path(name)`` gives
    each PNG's file."""
    recorder = learn.recorder
    if recorder.history or recorder.losses:
        save_figure(loss_curves(recorder.losses, recorder.history), path("figures/loss.png"))
    if recorder.lrs:
        save_figure(lr_schedule(recorder.lrs), path("figures/lr.png"))
    write_statistics_figures(learn.model, path, activations, gradients)
    doctor = getattr(learn, "doctor", None)
    if doctor is not None:
        write_finding_figures(ranked(doctor.findings), doctor.engine, path)
    if sample is not None:
        _feature_map_figures(learn.model, sample, path)


def write_statistics_figures(
    model: nn.Module,
    path: Callable[[str], Path],
    activations: ActivationRecorder | None,
    gradients: GradientRecorder | None,
) -> None:
    """The activation curves and colorful-dimension images, and the gradient flow, of what was recorded
    (a Learner's callbacks or the recorders of ``hs.watch``)."""
    if activations is not None:
        _activation_figures(activations, model, path)
    if gradients is not None and any(gradients.param_history.values()):
        save_figure(gradient_flow(gradients.param_history), path("figures/gradient_flow.png"))


def _activation_figures(stats: ActivationRecorder, model: nn.Module, path: Callable[[str], Path]) -> None:
    history = stats.history
    watched = [name for name, records in history.items() if records]
    if not watched:
        return
    nonlinear = {name for name, module in model.named_modules() if isinstance(module, ACTIVATIONS)}
    shown = [n for n in watched if n in nonlinear] or watched
    save_figure(activation_curves(history, shown[:MAX_CURVES]), path("figures/activations.png"))
    for name in shown[:MAX_COLORFUL]:
        save_figure(colorful_dimension(history, name), path(f"figures/colorful_{name}.png"))


def _feature_map_figures(model: nn.Module, sample: tuple, path: Callable[[str], Path]) -> None:
    """What the first conv layers learned to see, on one sample (eval mode; the mode comes back)."""
    convs = [name for name, module in model.named_modules() if isinstance(module, nn.Conv2d)]
    convs = convs[:FEATURE_MAP_LAYERS]
    if not convs:
        return
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), capture(model, convs) as cap:
            model(*sample)
    finally:
        model.train(was_training)
    for name in convs:
        fig = feature_maps(
            cap[name].float().cpu(), max_maps=32, ncols=8, title=f"{name} on a validation sample"
        )
        save_figure(fig, path(f"figures/feature_maps_{name}.png"), dpi=80)
