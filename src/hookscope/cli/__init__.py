"""The ``hookscope`` command: ``train``, ``inspect``, ``summary``, ``report`` and ``compare``.

Exit codes: 0 success, 1 runtime failure (training failed, a folder cannot be written), 2 usage error (a
model, data, image or input size that cannot be used; argparse's own errors). Every error is one line on
stderr naming the thing and the fix; ``--debug`` adds the traceback.

This module holds the parser only (argparse, no torch), so ``hookscope --help`` answers at once. Each
command's handler lives in its own module (``train``, ``inspect``, ``summary``, ``report``), imported only
when that command runs; ``common`` holds the exit codes and error helpers they share.
"""

from __future__ import annotations

import argparse
import importlib
import shlex
import sys
import traceback
import warnings
from collections.abc import Callable, Sequence

from hookscope._lazy import lazy_exports
from hookscope.cli.options import DEFAULTS, tracker_names

Handler = Callable[[argparse.Namespace], int]

# The error helpers' public names, still importable from here (they import torch, so only when asked).
__getattr__, __dir__ = lazy_exports(
    __name__,
    {name: "hookscope.cli.common" for name in ("CommandError", "RUNTIME_ERROR", "USAGE_ERROR")},
)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``) and return the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.command_line = shlex.join(["hookscope", *argv])
    shown = warnings.showwarning
    warnings.showwarning = _warning_line(args.command)
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        print(f"hookscope {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        from hookscope.cli.common import _explain

        if args.debug:
            traceback.print_exc()
        code, message = _explain(err)
        hint = "" if args.debug else " (--debug shows the traceback)"
        print(f"hookscope {args.command}: error: {message}{hint}", file=sys.stderr)
        return code
    finally:
        warnings.showwarning = shown


def _warning_line(command: str) -> Callable[..., None]:
    """A ``warnings.showwarning`` printing ``hookscope <command>: warning: <message>`` on one line, in the
    command's voice (Python's default adds the file, the line number and the source line)."""

    def show(message: Warning | str, category: type[Warning], *args: object, **kwargs: object) -> None:
        text = " ".join(str(message).split())
        print(f"hookscope {command}: warning: {text}", file=sys.stderr)

    return show


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
    _add_compare(commands, common)
    return parser


def _handler(command: str) -> Handler:
    """The handler of ``command``: imports ``hookscope.cli.<command>`` (and torch) only when it runs."""

    def handle(args: argparse.Namespace) -> int:
        return importlib.import_module(f"hookscope.cli.{command}").run(args)

    handle.__name__ = handle.__qualname__ = f"run_{command}"
    return handle


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
        help=f"torchvision name, package.module:factory or file.py:factory (default {DEFAULTS.model})",
    )
    p.add_argument("--weights", metavar="FILE", help="a local state_dict to start from (torch.save)")
    p.add_argument(
        "--data",
        help="digits, an image folder (<class>/<image>.png) or a .pt/.npz file with x "
        f"and y (default {DEFAULTS.data})",
    )
    p.add_argument("--epochs", type=_positive_int, help=f"number of epochs (default {DEFAULTS.epochs})")
    p.add_argument(
        "--lr",
        type=_positive_float,
        help=f"peak learning rate of the one-cycle schedule (default {DEFAULTS.lr})",
    )
    p.add_argument("--batch-size", type=_positive_int, help=f"batch size (default {DEFAULTS.batch_size})")
    p.add_argument(
        "--precision", choices=("32", "bf16", "fp16"), help="32 (default), bf16 or fp16 (CUDA only)"
    )
    p.add_argument("--clip", type=_positive_float, help="clip the gradient norm to this value")
    p.add_argument(
        "--image-size",
        type=_positive_int,
        help=f"side of the images read from an image folder (default {DEFAULTS.image_size})",
    )
    p.add_argument("--out", help="the run folder to write (default runs/<model>-<date>-<time>)")
    p.add_argument("--seed", type=int, help=f"random seed (default {DEFAULTS.seed})")
    p.add_argument(
        "--no-doctor",
        action="store_true",
        help="turn off the doctor and the activation/gradient statistics (faster)",
    )
    p.add_argument(
        "--preflight",
        action="store_true",
        default=None,
        help="check model, data and loss before training (hs.preflight: labels, output vs loss, input "
        "scale, samples mixing, loss at initialisation, overfitting one batch); findings go to "
        "preflight.json and the report",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        default=None,
        help="profile 5 training steps after the warm-up (torch.profiler) and name the layers that take "
        "most of the forward and backward time (the doctor's slow_layers)",
    )
    p.add_argument("--device", help="torch device, e.g. cpu or cuda (default: cuda when available)")
    p.add_argument(
        "--log",
        type=_trackers,
        metavar="TRACKERS",
        help="also log to tensorboard, wandb and/or mlflow, comma separated, inside the run folder (W&B "
        "offline unless WANDB_MODE says otherwise; MLflow in mlflow.db unless MLFLOW_TRACKING_URI is set)",
    )
    p.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue an interrupted or finished run from its last checkpoint (only --epochs may change)",
    )
    p.add_argument(
        "--resume-from",
        metavar="FILE",
        help="with --resume: continue from this checkpoint file instead of the run's newest one",
    )
    p.add_argument(
        "--allow-other-run",
        action="store_true",
        help="with --resume: continue a checkpoint that another run wrote (refused by default, as it would "
        "continue that run under this one's name; to start from its weights use --weights)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the hookscope run already in --out, or discard its unfinished run",
    )
    p.set_defaults(handler=_handler("train"))


def _add_inspect(commands: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = commands.add_parser(
        "inspect",
        parents=[common],
        help="capture layers on one image and write a feature-map grid per layer plus index.html",
        description="Run MODEL on one image, capture the selected layers' outputs, and write one "
        "feature-map grid PNG per layer and an index.html.",
    )
    _add_model(p)
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
    p.set_defaults(handler=_handler("inspect"))


def _add_summary(commands: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = commands.add_parser(
        "summary",
        parents=[common],
        help="print the layer table: shapes, parameters, MACs",
        description="Print MODEL's summary table for one input of --input-size.",
    )
    _add_model(p)
    p.add_argument(
        "--input-size", default="1,3,224,224", help="input shape, comma separated (default 1,3,224,224)"
    )
    p.set_defaults(handler=_handler("summary"))


def _add_report(commands: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = commands.add_parser(
        "report",
        parents=[common],
        help="rebuild report.html from a run folder",
        description="Rebuild RUN_DIR/report.html from the files of the run folder.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="a folder written by hookscope train")
    p.set_defaults(handler=_handler("report"))


def _add_compare(commands: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = commands.add_parser(
        "compare",
        parents=[common],
        help="compare two run folders and write compare.html: where they part, config, curves, findings",
        description="Compare RUN_A and RUN_B (folders written by hookscope train): config differences, "
        "metric curves overlaid, the first step and layer where their statistics part beyond noise, and "
        "the findings of each, in DIR/compare.html.",
    )
    p.add_argument("run_a", metavar="RUN_A", help="a folder written by hookscope train")
    p.add_argument("run_b", metavar="RUN_B", help="another one")
    p.add_argument("--out", default=".", metavar="DIR", help="where to write compare.html (default: here)")
    p.set_defaults(handler=_handler("compare"))


def _add_model(p: argparse.ArgumentParser) -> None:
    """MODEL and --weights, as inspect and summary take them (train names its model with --model)."""
    p.add_argument(
        "model", metavar="MODEL", help="torchvision name, package.module:factory or file.py:factory"
    )
    p.add_argument("--weights", metavar="FILE", help="a local state_dict to load (torch.save)")


def _trackers(text: str) -> str:
    try:
        return ",".join(tracker_names(text))
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix(f"--log {text}: ")) from None


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
