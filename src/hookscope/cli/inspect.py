"""``hookscope inspect``: capture layers on one image, write a feature-map grid per layer and index.html."""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Iterator

import torch
from torch import nn

from hookscope.atomic import atomic_write_json
from hookscope.cli.common import _one_line, _options, _short_name
from hookscope.data.images import load_image, sample_image
from hookscope.hooks.capture import capture
from hookscope.hooks.select import Spec
from hookscope.specs import IMAGENET_MEAN, IMAGENET_STD, SpecError, load_model
from hookscope.staged_folder import StagedFolder
from hookscope.viz.feature_maps import feature_maps
from hookscope.viz.report import write_feature_map_index
from hookscope.viz.save import save_figure


def run(args: argparse.Namespace) -> int:
    model = load_model(args.model, weights=args.weights).eval()
    image = _read_image(args.image, args.size)
    selection = _selection(args.select)
    _refuse_unknown_names(model, args.model, selection)
    maps, skipped = _captured_maps(model, args.model, image, selection)
    if not maps:
        raise SpecError(
            f"--select {args.select!r} captured no 4-D feature map in {args.model}; select conv layers, "
            "e.g. --select Conv2d"
        )
    if skipped:
        print(
            f"note: --select: skipped {', '.join(skipped)}: not a 4-D (N, C, H, W) feature map, which is "
            "what a grid draws",
            file=sys.stderr,
        )
    out = args.out or f"runs/inspect-{_short_name(args.model)}"
    # inspect output is derived and regenerable: an older inspect folder there is replaced
    folder = StagedFolder.start(out, "inspect", overwrite=True)
    atomic_write_json(folder.file("config.json"), {"command": args.command_line, "options": _options(args)})
    layers = []
    for i, (label, tensor) in _with_progress(maps):
        png = f"{i:02d}_{re.sub(r'[^A-Za-z0-9_.-]', '_', label)}.png"
        channels = tensor.shape[1]
        title = f"{label}: {min(channels, 64)} of {channels} channels"
        save_figure(feature_maps(tensor, max_maps=64, title=title), folder.file(png), dpi=60)
        layers.append((label, png, "×".join(str(n) for n in tensor.shape)))
    index = write_feature_map_index(folder.path, layers, f"Feature maps of {args.model}")
    final = folder.finish()
    print(f"{len(layers)} feature-map grids: {final / index.name}")
    return 0


def _refuse_unknown_names(model: nn.Module, name: str, selection: Spec) -> None:
    """A list of names is matched exactly; one that names no module would otherwise be dropped silently."""
    if not isinstance(selection, list):
        return
    names = [n for n, _ in model.named_modules() if n]
    unknown = [part for part in selection if part not in names]
    if not unknown:
        return
    closest = [c for part in unknown for c in difflib.get_close_matches(part, names, n=3, cutoff=0.5)]
    hint = f" (closest: {', '.join(dict.fromkeys(closest))})" if closest else ""
    verb = "is" if len(unknown) == 1 else "are"
    raise SpecError(
        f"--select: {', '.join(unknown)} {verb} not a module of {name}{hint}; "
        "give qualified module names (hookscope summary lists them), or one glob such as 'layer1.*'"
    )


def _captured_maps(
    model: nn.Module, name: str, image: torch.Tensor, selection: Spec
) -> tuple[list[tuple[str, torch.Tensor]], list[str]]:
    """``(label, (1, C, H, W) output)`` of every selected layer call, on the ImageNet-normalised image,
    and the labels of the selected calls whose output is not a 4-D map (with their type and shape)."""
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    with torch.no_grad(), capture(model, selection) as cap:
        try:
            model((image - mean) / std)
        except Exception as err:
            raise SpecError(
                f"{name} cannot run on the image tensor of shape {tuple(image.shape)} "
                f"({_one_line(str(err))}); inspect needs a model taking 3-channel images, or change --size"
            ) from None
    maps, skipped = [], []
    for record in cap.records:
        several = len(cap.calls(record.name)) > 1
        label = f"{record.name} (call {record.call})" if several else record.name
        if isinstance(record.value, torch.Tensor) and record.value.ndim == 4:
            maps.append((label, record.value))
        else:
            module = type(model.get_submodule(record.name)).__name__
            skipped.append(f"{label} ({module}, {_output_kind(record.value)})")
    return maps, skipped


def _output_kind(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return "output " + "×".join(str(n) for n in value.shape)
    return f"output a {type(value).__name__}"


def _with_progress(maps: list[tuple[str, torch.Tensor]]) -> Iterator[tuple[int, tuple[str, torch.Tensor]]]:
    """Enumerate ``maps`` while showing progress on stderr: a rich bar on a terminal, else a line per grid.

    A grid takes a fraction of a second, a large model has dozens: without this, inspect looks stuck.
    """
    if not sys.stderr.isatty():
        for i, item in enumerate(maps):
            print(f"grid {i + 1}/{len(maps)}: {item[0]}", file=sys.stderr, flush=True)
            yield i, item
        return
    from rich.console import Console  # rich loads only for a terminal
    from rich.progress import track

    yield from enumerate(track(maps, description="feature-map grids", console=Console(stderr=True)))


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
