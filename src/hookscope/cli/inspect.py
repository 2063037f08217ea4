"""``hookscope inspect``: capture layers on one image, write a feature-map grid per layer and index.html."""

from __future__ import annotations

import argparse
import re

import torch
from torch import nn

from hookscope.atomic import atomic_write_json
from hookscope.cli.common import _one_line, _options, _short_name
from hookscope.data.images import load_image, sample_image
from hookscope.hooks.capture import capture
from hookscope.hooks.select import Spec
from hookscope.specs import IMAGENET_MEAN, IMAGENET_STD, SpecError, load_model
from hookscope.staged_folder import StagedFolder
from hookscope.viz.feature_maps import feature_maps, save_figure
from hookscope.viz.report import write_feature_map_index


def run(args: argparse.Namespace) -> int:
    model = load_model(args.model, weights=args.weights).eval()
    image = _read_image(args.image, args.size)
    maps = _captured_maps(model, args.model, image, _selection(args.select))
    if not maps:
        raise SpecError(
            f"--select {args.select!r} captured no 4-D feature map in {args.model}; select conv layers, "
            "e.g. --select Conv2d"
        )
    out = args.out or f"runs/inspect-{_short_name(args.model)}"
    # inspect output is derived and regenerable: an older inspect folder there is replaced
    folder = StagedFolder.start(out, "inspect", overwrite=True)
    atomic_write_json(folder.file("config.json"), {"command": args.command_line, "options": _options(args)})
    layers = []
    for i, (label, tensor) in enumerate(maps):
        png = f"{i:02d}_{re.sub(r'[^A-Za-z0-9_.-]', '_', label)}.png"
        channels = tensor.shape[1]
        title = f"{label}: {min(channels, 64)} of {channels} channels"
        save_figure(feature_maps(tensor, max_maps=64, title=title), folder.file(png), dpi=60)
        layers.append((label, png, "×".join(str(n) for n in tensor.shape)))
    index = write_feature_map_index(folder.path, layers, f"Feature maps of {args.model}")
    final = folder.finish()
    print(f"{len(layers)} feature-map grids: {final / index.name}")
    return 0


def _captured_maps(
    model: nn.Module, name: str, image: torch.Tensor, spec: Spec
) -> list[tuple[str, torch.Tensor]]:
    """``(label, (1, C, H, W) output)`` of every selected layer call, on the ImageNet-normalised image."""
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    with torch.no_grad(), capture(model, spec) as cap:
        try:
            model((image - mean) / std)
        except Exception as err:
            raise SpecError(
                f"{name} cannot run on the image tensor of shape {tuple(image.shape)} "
                f"({_one_line(str(err))}); inspect needs a model taking 3-channel images, or change --size"
            ) from None
    maps = []
    for record in cap.records:
        if isinstance(record.value, torch.Tensor) and record.value.ndim == 4:
            several = len(cap.calls(record.name)) > 1
            maps.append((f"{record.name} (call {record.call})" if several else record.name, record.value))
    return maps


def _read_image(image: str, size: int) -> torch.Tensor:
    if image == "sample":
        return sample_image(size)
    try:
        return load_image(image, size)
    except (FileNotFoundError, ValueError) as err:
        raise SpecError(f"--image {image}: {err}") from None


def _selection(text: str) -> Spec:
    """``Conv2d,Linear`` -> a tuple of nn types; ``a,b`` -> a list of names; anything else a glob."""
    parts = [p.strip().removeprefix("nn.") for p in text.split(",") if p.strip()]
    types = [getattr(nn, p, None) for p in parts]
    if parts and all(isinstance(t, type) and issubclass(t, nn.Module) for t in types):
        return tuple(types)
    return parts if len(parts) > 1 else text
