"""``hookscope train``: train a model and write a run folder (the job is :func:`hookscope.demo.run`)."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime

from hookscope import demo
from hookscope.cli.common import USAGE_ERROR, CommandError, _explain, _short_name
from hookscope.cli.options import OPTION_NAMES, TrainOptions
from hookscope.run_folder import RunFolder, read_json


def run(args: argparse.Namespace) -> int:
    given = {k: getattr(args, k) for k in OPTION_NAMES if getattr(args, k, None) is not None}
    if args.no_doctor:
        given["doctor"] = False
    if args.resume:
        folder, options = _resumed(args.resume, given)
    else:
        options = TrainOptions(**given)
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


def _resumed(run_dir: str, given: dict[str, object]) -> tuple[RunFolder, TrainOptions]:
    changed = sorted(set(given) - {"epochs", "device"})
    if changed:
        raise CommandError(
            f"--resume continues {run_dir} with its own options; {', '.join(map(_flag, changed))} "
            "cannot change (only --epochs and --device can)",
            USAGE_ERROR,
        )
    folder = RunFolder.resume(run_dir)
    options = TrainOptions(**read_json(folder.path / "config.json")["options"])
    for key, value in given.items():
        setattr(options, key, value)
    return folder, options


def _flag(option: str) -> str:
    """The command-line flag of a TrainOptions field: ``batch_size`` -> ``--batch-size``."""
    return "--no-doctor" if option == "doctor" else "--" + option.replace("_", "-")
