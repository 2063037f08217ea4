"""``hookscope report``: rebuild ``report.html`` from a run folder."""

from __future__ import annotations

import argparse
from pathlib import Path

from hookscope.cli.common import USAGE_ERROR, CommandError
from hookscope.viz.report import write_report


def run(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    if not (run_dir / "config.json").is_file():
        raise CommandError(
            f"{run_dir} is not a hookscope run folder (no config.json); "
            "give a folder written by hookscope train",
            USAGE_ERROR,
        )
    print(write_report(run_dir))
    return 0
