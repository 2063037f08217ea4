"""Runs side by side on one machine: a second ``hookscope train`` at a live run's ``--out`` is refused
(also with ``--overwrite``) naming the writer; once the writer is killed the run is unfinished and
``--resume`` is offered. Real processes, as a shell loop of ``hookscope train ... &`` starts them."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import hookscope
from hookscope.folder_lock import holder

SOURCE = str(Path(hookscope.__file__).parents[1])  # this checkout's code in the child processes too
TRAIN = ("train", "--batch-size", "128", "--seed", "0")


def start(*args, cwd):
    """``hookscope train`` in its own process, its stdout unbuffered (its lines are the test's events)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": SOURCE}
    command = [sys.executable, "-m", "hookscope", *TRAIN, *args]
    return subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def errors(process):
    """Exit code and stderr lines (``note:`` lines, which inform, left out) of a finished process."""
    _, err = process.communicate(timeout=300)
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("note:")]
    return process.returncode, lines


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_live_run_is_neither_joined_nor_overwritten(tmp_path):
    first = start("--epochs", "2", "--preflight", "--out", "run", cwd=tmp_path)
    # preflight prints once the run's lock is held and before training starts; the writer is then paused,
    # so that it is live for as long as the others take, however slow the machine
    assert first.stdout.readline().startswith("preflight")
    first.send_signal(signal.SIGSTOP)
    again = start("--epochs", "1", "--out", "run", cwd=tmp_path)
    overwrite = start("--epochs", "1", "--out", "run", "--overwrite", cwd=tmp_path)
    for second in (again, overwrite):
        code, lines = errors(second)
        assert code == 2 and len(lines) == 1, lines
        assert f"the run folder {tmp_path / 'run'} is in use by pid {first.pid} on " in lines[0]
        assert "since 20" in lines[0] and "--resume" not in lines[0]
    first.send_signal(signal.SIGCONT)
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["status"] == "complete" and config["options"]["epochs"] == 2  # the first run, whole
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["epoch"] for row in rows if row["kind"] == "epoch"] == [0, 1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no lock file, no partial left


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_after_kill_9_the_run_is_unfinished_and_only_then_resume_is_offered(tmp_path):
    first = start("--epochs", "50", "--no-doctor", "--out", "run", cwd=tmp_path)
    checkpoint = tmp_path / ".run.partial" / "checkpoints" / "last.pt"
    deadline = time.monotonic() + 300
    while not checkpoint.is_file() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)  # waiting for the first epoch's checkpoint (no event to wait on in another process)
    assert holder(tmp_path / "run")["pid"] == first.pid
    os.kill(first.pid, signal.SIGKILL)
    first.wait(timeout=60)
    assert holder(tmp_path / "run") is None  # the lock died with its process
    code, lines = errors(start("--epochs", "1", "--out", "run", cwd=tmp_path))
    assert code == 2 and len(lines) == 1, lines
    assert f"holds an unfinished run of --out {tmp_path / 'run'} (its writer, pid {first.pid} on " in lines[0]
    assert f"is gone); continue it with `hookscope train --resume {tmp_path / '.run.partial'}`" in lines[0]
    assert checkpoint.is_file()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_four_runs_at_once_into_one_mlflow_store_each_in_its_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'sweep.db'}")
    lrs = ["1e-3", "3e-3", "1e-2", "3e-2"]
    runs = [
        start("--epochs", "1", "--lr", lr, "--out", f"runs/lr-{lr}", "--log", "mlflow", cwd=tmp_path)
        for lr in lrs
    ]
    for process in runs:
        _, err = process.communicate(timeout=600)
        assert process.returncode == 0, err
        assert "MLflowCallback" not in err  # no tracker warned
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'sweep.db'}")
    found = client.search_runs([client.get_experiment_by_name("hookscope").experiment_id])
    assert sorted(run.info.run_name for run in found) == sorted(f"lr-{lr}" for lr in lrs)
    for run in found:
        folder = tmp_path / "runs" / run.info.run_name
        rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
        (epoch,) = [row for row in rows if row["kind"] == "epoch"]
        logged = client.get_metric_history(run.info.run_id, "epoch/valid_loss")
        assert run.info.status == "FINISHED" and [m.value for m in logged] == pytest.approx(
            [epoch["valid_loss"]]
        )
        assert json.loads((folder / "config.json").read_text())["status"] == "complete"
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == sorted(f"lr-{lr}" for lr in lrs)
