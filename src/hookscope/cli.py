"""The ``hookscope`` command: ``train``, ``inspect``, ``summary`` and ``report``.

Exit codes: 0 success, 1 runtime failure (training failed, a folder cannot be written), 2 usage error (a
model, data, image or input size that cannot be used; argparse's own errors). Every error is one line on
stderr naming the thing and the fix; ``--debug`` adds the traceback.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
import traceback
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path

import torch
from torch import nn

from hookscope import demo
from hookscope.atomic import atomic_write_json
from hookscope.data.images import load_image, sample_image
from hookscope.hooks.capture import capture
from hookscope.hooks.select import SelectionError, Spec
from hookscope.run_folder import RunFolder, RunFolderError, RunFolderWriteError, read_json
from hookscope.specs import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    SpecError,
    checked_summary,
    load_model,
    parse_input_size,
)
from hookscope.viz.feature_maps import feature_maps, save_figure
from hookscope.viz.report import write_feature_map_index, write_report

USAGE_ERROR = 2
RUNTIME_ERROR = 1


class CommandError(Exception):
    """A failure the command reports in one line, with the exit code to use."""

    def __init__(self, message: str, exit_code: int = RUNTIME_ERROR) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``) and return the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.command_line = shlex.join(["hookscope", *argv])
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        print(f"hookscope {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        if args.debug:
            traceback.print_exc()
        code, message = _explain(err)
        hint = "" if args.debug else " (--debug shows the traceback)"
        print(f"hookscope {args.command}: error: {message}{hint}", file=sys.stderr)
        return code


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every sub-command (also used by the docs and the tests)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", help="print the full traceback on errors")
    parser = argparse.ArgumentParser(
        prog="hookscope",
        description="See inside PyTorch models and train them: run folders, feature maps, summaries, report.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_train(commands, common)
    _add_inspect(commands, common)
    _add_summary(commands, common)
    _add_report(commands, common)
    return parser


def _add_train(commands: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = commands.add_parser(
        "train",
        parents=[common],
        help="train a model and write a run folder with metrics, findings, checkpoints and report.html",
        description="Train MODEL on DATA with the doctor and statistics on, and write a run folder "
        "(config.json, metrics.csv/.jsonl, findings.json, summary.txt, checkpoints/, figures/, report.html).",
    )
    p.add_argument(
        "--model",
        help=f"torchvision name, package.module:factory or file.py:factory (default {demo.DEFAULTS.model})",
    )
    p.add_argument("--weights", metavar="FILE", help="a local state_dict to start from (torch.save)")
    p.add_argument(
        "--data",
        help="digits, an image folder (<class>/<image>.png) or a .pt/.npz file with x "
        f"and y (default {demo.DEFAULTS.data})",
    )
    p.add_argument("--epochs", type=_positive_int, help=f"number of epochs (default {demo.DEFAULTS.epochs})")
    p.add_argument(
        "--lr",
        type=_positive_float,
        help=f"peak learning rate of the one-cycle schedule (default {demo.DEFAULTS.lr})",
    )
    p.add_argument(
        "--batch-size", type=_positive_int, help=f"batch size (default {demo.DEFAULTS.batch_size})"
    )
    p.add_argument(
        "--precision", choices=("32", "bf16", "fp16"), help="32 (default), bf16 or fp16 (CUDA only)"
    )
    p.add_argument("--clip", type=_positive_float, help="clip the gradient norm to this value")
    p.add_argument(
        "--image-size",
        type=_positive_int,
        help=f"side of the images read from an image folder (default {demo.DEFAULTS.image_size})",
    )
    p.add_argument("--out", help="the run folder to write (default runs/<model>-<date>-<time>)")
    p.add_argument("--seed", type=int, help=f"random seed (default {demo.DEFAULTS.seed})")
    p.add_argument(
        "--no-doctor",
        action="store_true",
        help="turn off the doctor and the activation/gradient statistics (faster)",
    )
    p.add_argument("--device", help="torch device, e.g. cpu or cuda (default: cuda when available)")
    p.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue an interrupted or finished run from its last checkpoint (only --epochs may change)",
    )
    p.set_defaults(handler=_train)


def _add_inspect(commands: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = commands.add_parser(
        "inspect",
        parents=[common],
        help="capture layers on one image and write a feature-map grid per layer plus index.html",
        description="Run MODEL on one image, capture the selected layers' outputs, and write one "
        "feature-map grid PNG per layer and an index.html.",
    )
    p.add_argument(
        "model", metavar="MODEL", help="torchvision name, package.module:factory or file.py:factory"
    )
    p.add_argument("--weights", metavar="FILE", help="a local state_dict to load (torch.save)")
    p.add_argument(
        "--image", default="sample", help="a PNG/JPEG file, or 'sample' for the bundled photo (default)"
    )
    p.add_argument("--size", type=_positive_int, default=224, help="image side in pixels (default 224)")
    p.add_argument(
        "--select",
        default="Conv2d",
        help="which layers: nn type names (Conv2d,Linear) or a "
        "glob over qualified names (layer1.*.conv*); default Conv2d",
    )
    p.add_argument("--out", help="output folder (default runs/inspect-<model>)")
    p.set_defaults(handler=_inspect)


def _add_summary(commands: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = commands.add_parser(
        "summary",
        parents=[common],
        help="print the layer table: shapes, parameters, MACs",
        description="Print MODEL's summary table for one input of --input-size.",
    )
    p.add_argument(
        "model", metavar="MODEL", help="torchvision name, package.module:factory or file.py:factory"
    )
    p.add_argument("--weights", metavar="FILE", help="a local state_dict to load (torch.save)")
    p.add_argument(
        "--input-size", default="1,3,224,224", help="input shape, comma separated (default 1,3,224,224)"
    )
    p.set_defaults(handler=_summary)


def _add_report(commands: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = commands.add_parser(
        "report",
        parents=[common],
        help="rebuild report.html from a run folder",
        description="Rebuild RUN_DIR/report.html from the files of the run folder.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="a folder written by hookscope train")
    p.set_defaults(handler=_report)


def _train(args: argparse.Namespace) -> int:
    given = {k: getattr(args, k) for k in demo.OPTION_NAMES if getattr(args, k, None) is not None}
    if args.no_doctor:
        given["doctor"] = False
    if args.resume:
        folder, options = _resumed(args.resume, given)
    else:
        options = demo.TrainOptions(**given)
        out = args.out or f"runs/{_short_name(options.model)}-{datetime.now():%Y%m%d-%H%M%S}"
        folder = RunFolder.start(out)
    options.out = str(folder.final)
    try:
        result = demo.run(options, folder, resume=bool(args.resume), command=args.command_line)
    except KeyboardInterrupt:
        print(f"hookscope train: interrupted{_resume_hint(folder)}", file=sys.stderr)
        return 130
    except Exception as err:
        code, message = _explain(err)
        hint = _resume_hint(folder)
        if not hint and not args.resume:
            folder.discard()
        raise CommandError(message + hint, code) from err
    final = folder.finish()
    print(demo.closing_words(result, final))
    return 0


def _resume_hint(folder: RunFolder) -> str:
    """Where the unfinished run is, and the command that continues it (when a checkpoint was saved)."""
    if not (folder.path / "checkpoints" / "last.pt").is_file():
        return ""
    return f"; the unfinished run is kept: hookscope train --resume {folder.path}"


def _resumed(run_dir: str, given: dict[str, object]) -> tuple[RunFolder, demo.TrainOptions]:
    changed = sorted(set(given) - {"epochs", "device"})
    if changed:
        raise CommandError(
            f"--resume continues {run_dir} with its own options; {', '.join(map(_flag, changed))} "
            "cannot change (only --epochs and --device can)",
            USAGE_ERROR,
        )
    folder = RunFolder.resume(run_dir)
    options = demo.TrainOptions(**read_json(folder.path / "config.json")["options"])
    for key, value in given.items():
        setattr(options, key, value)
    return folder, options


def _inspect(args: argparse.Namespace) -> int:
    model = load_model(args.model, weights=args.weights).eval()
    image = _read_image(args.image, args.size)
    maps = _captured_maps(model, args.model, image, _selection(args.select))
    if not maps:
        raise SpecError(
            f"--select {args.select!r} captured no 4-D feature map in {args.model}; select conv layers, "
            "e.g. --select Conv2d"
        )
    folder = RunFolder.start(args.out or f"runs/inspect-{_short_name(args.model)}")
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


def _summary(args: argparse.Namespace) -> int:
    size = parse_input_size(args.input_size)
    model = load_model(args.model, weights=args.weights)
    fix = f"pass the input shape {args.model} expects with --input-size (batch first, e.g. 1,3,224,224)"
    print(checked_summary(model, args.model, fix, input_size=size), end="")
    return 0


def _report(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    if not (run_dir / "config.json").is_file():
        raise CommandError(
            f"{run_dir} is not a hookscope run folder (no config.json); "
            "give a folder written by hookscope train",
            USAGE_ERROR,
        )
    print(write_report(run_dir))
    return 0


def _explain(err: Exception) -> tuple[int, str]:
    """Exit code and one-line message for an exception that reached the command."""
    if isinstance(err, CommandError):
        return err.exit_code, _one_line(str(err))
    if isinstance(err, RunFolderWriteError):
        return RUNTIME_ERROR, _one_line(str(err))
    if isinstance(err, SpecError | RunFolderError | SelectionError):
        return USAGE_ERROR, _one_line(str(err))
    if isinstance(err, OSError) and err.filename:
        return RUNTIME_ERROR, f"cannot access {err.filename}: {err.strerror}; check the path and permissions"
    return RUNTIME_ERROR, _one_line(f"{type(err).__name__}: {err}")


def _flag(option: str) -> str:
    """The command-line flag of a TrainOptions field: ``batch_size`` -> ``--batch-size``."""
    return "--no-doctor" if option == "doctor" else "--" + option.replace("_", "-")


def _options(args: argparse.Namespace) -> dict[str, object]:
    return {k: v for k, v in vars(args).items() if k not in ("handler", "debug", "command", "command_line")}


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _short_name(model_spec: str) -> str:
    """``hookscope.models:digits_cnn`` -> ``digits_cnn``; ``models/net.py:build`` -> ``build``."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", model_spec.rpartition(":")[2]) or "model"


def _positive_int(text: str) -> int:
    return _positive(text, int)


def _positive_float(text: str) -> float:
    return _positive(text, float)


def _positive(text: str, kind: Callable[[str], float]) -> float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} must be greater than 0")
    return value
