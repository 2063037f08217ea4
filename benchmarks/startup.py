"""Start-up time: how long a fresh process takes to import hookscope or print the command's help.

Each variant is a whole new process (the interpreter's own start included), run alternating with the
others (medians over rounds, wall clock):

- ``import torch`` (baseline): ``python -c "import torch"``;
- ``import hookscope``: ``python -c "import hookscope"``;
- ``import hookscope; hs.Learner``: the package and the training loop's module (torch included), the cost
  of a script that trains (reported, no target);
- ``hookscope --help`` and ``hookscope train --help``: the virtualenv's ``hookscope`` console script next
  to this interpreter (``python -m hookscope`` where there is none).

Targets: ``hookscope --help`` under 0.3 s (it must not import torch), and ``import hookscope`` at most
``import torch`` + 0.15 s (it imports torch and nothing heavy: matplotlib, rich, scikit-learn, torchvision
load when a feature needs them).

    cd benchmarks && ../.venv/bin/python startup.py                     # full run (15 rounds)
    cd benchmarks && ../.venv/bin/python startup.py --quick             # smoke test (2 rounds)
    cd benchmarks && ../.venv/bin/python startup.py --src /tmp/old/src  # another checkout's source
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from common import median, run_alternating  # benchmarks/

HELP_LIMIT_S = 0.3
LEARNER = "import hookscope; hs.Learner"
IMPORT_MARGIN_S = 0.15


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny settings: checks the script runs")
    parser.add_argument("--rounds", type=int, default=15, help="rounds per variant; the median is reported")
    parser.add_argument(
        "--src",
        type=Path,
        help="measure the hookscope package under this folder (put first on PYTHONPATH), e.g. the src/ "
        "of a `git worktree` of an older commit; default: the installed one",
    )
    return parser.parse_args()


def hookscope_command() -> list[str]:
    """The console script installed next to this interpreter, else ``python -m hookscope``."""
    script = Path(sys.executable).with_name("hookscope")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "hookscope"]


def timed_process(argv: list[str], env: dict[str, str]) -> Callable[[], float]:
    """A variant: run ``argv`` to completion, fail loudly if it fails, return its wall time in seconds."""

    def run() -> float:
        start = time.perf_counter()
        done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        elapsed = time.perf_counter() - start
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr}")
        return elapsed

    return run


def measured_package(env: dict[str, str]) -> str:
    """Where the measured ``hookscope`` comes from (checks that ``--src`` took effect)."""
    code = "import hookscope, torch; print(hookscope.__file__, 'torch', torch.__version__)"
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()


def main() -> None:
    args = parse_args()
    rounds = 2 if args.quick else args.rounds
    env = dict(os.environ)
    if args.src:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(args.src.resolve()), env.get("PYTHONPATH")]))
    cli = hookscope_command()
    variants = {
        "python -c 'import torch'": timed_process([sys.executable, "-c", "import torch"], env),
        "python -c 'import hookscope'": timed_process([sys.executable, "-c", "import hookscope"], env),
        LEARNER: timed_process([sys.executable, "-c", "import hookscope as hs; hs.Learner"], env),
        "hookscope --help": timed_process([*cli, "--help"], env),
        "hookscope train --help": timed_process([*cli, "train", "--help"], env),
    }
    for run in variants.values():
        run()  # warm-up: bytecode caches and the OS file cache
    times = run_alternating(variants, rounds)
    medians = {name: median(values) for name, values in times.items()}

    print(
        f"Start-up, fresh processes, median of {rounds} rounds (wall clock); {platform.machine()}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}"
    )
    print(f"  measuring {measured_package(env)}; command: {' '.join(Path(a).name for a in cli)}")
    print(f"  {'variant':<32}{'median s':>10}{'min s':>9}{'max s':>9}")
    for name, values in times.items():
        print(f"  {name:<32}{medians[name]:>10.3f}{min(values):>9.3f}{max(values):>9.3f}")
    help_s = medians["hookscope --help"]
    torch_s, import_s = medians["python -c 'import torch'"], medians["python -c 'import hookscope'"]
    print("Targets:")
    print(f"  hookscope --help {help_s:.3f} s < {HELP_LIMIT_S} s: {verdict(help_s < HELP_LIMIT_S)}")
    print(
        f"  import hookscope {import_s:.3f} s <= import torch {torch_s:.3f} s + {IMPORT_MARGIN_S} s "
        f"(+{import_s - torch_s:.3f} s): {verdict(import_s <= torch_s + IMPORT_MARGIN_S)}"
    )
    extra = medians[LEARNER] - torch_s
    print(f"  (no target) import hookscope; hs.Learner: +{extra:.3f} s over import torch")


def verdict(ok: bool) -> str:
    return "pass" if ok else "FAIL"


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"(benchmark took {time.perf_counter() - start:.0f} s)")
