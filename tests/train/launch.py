"""Launching the multi-process tests' scripts: in one process, or under torchrun (2 processes on CPU with
gloo, a free port each time), with a timeout each so that a hang fails instead of blocking CI."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

SCRIPT = Path(__file__).with_name("distributed_script.py")  # the Learner's script
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]


def one_process(script: Path, out: Path, *options: str) -> None:
    """Run ``script --out out options`` in one plain process; fail with its output when it fails."""
    done = subprocess.run(
        [sys.executable, str(script), "--out", str(out), *options],
        capture_output=True,
        text=True,
        timeout=150,
        env=ENV,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def torchrun(*args: str, nproc: int = 2, timeout: float = 150) -> subprocess.CompletedProcess[str]:
    """Run ``args`` (a script and its options, or ``-m module ...``) under torchrun."""
    command = [*TORCHRUN, f"--nproc-per-node={nproc}", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=ENV, check=False)


def two_processes(script: Path, out: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """Run ``script --out out options`` under torchrun; fail with its output when it fails."""
    done = torchrun(str(script), "--out", str(out), *options)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def results(out: Path, nproc: int = 2) -> list[dict]:
    """What each rank of a script's run wrote (``rank<r>.pt``)."""
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(nproc)]


def kill_9_at_step_7(command: list[str], out: Path) -> None:
    """Run the torchrun ``command`` (the script with ``--out out``) until both ranks paused after step 7,
    then kill -9 the launcher and both ranks."""
    job = subprocess.Popen(
        [*command, "--pause-at", "7"],
        env=ENV,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    ranks: list[int] = []
    try:
        paused = [out / "paused0", out / "paused1"]
        deadline = time.monotonic() + 150
        while not all(p.exists() for p in paused) and time.monotonic() < deadline and job.poll() is None:
            time.sleep(0.2)
        assert all(p.exists() for p in paused), "the job never reached step 7"
        time.sleep(0.2)  # the ids are written
        ranks += [int(p.read_text()) for p in paused]
    finally:
        # torchrun starts each rank in a session of its own: kill the launcher and both ranks at once
        for pid in [job.pid, *ranks]:
            os.kill(pid, signal.SIGKILL)
        job.wait()
