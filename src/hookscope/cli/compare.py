"""``hookscope compare RUN_A RUN_B``: two run folders side by side in one ``compare.html``.

A folder that is not a run is refused by :func:`~hookscope.viz.run_diff.read_run` (a usage error, exit 2).
"""

from __future__ import annotations

import argparse

from hookscope.viz.compare_runs import PAGE, compare_runs


def run(args: argparse.Namespace) -> int:
    comparison = compare_runs(args.run_a, args.run_b, out=args.out)
    print(f"{PAGE}: {comparison.page}")
    print(comparison.verdict())
    return 0
