"""The Learner under torchrun: 2 processes on CPU (gloo) against 1, failures, exact resume, the command.

Every multi-process test launches ``python -m torch.distributed.run --standalone`` (a free port each time)
on ``distributed_script.py`` and has a timeout, so a hang fails instead of blocking CI.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from launch import ENV, SCRIPT, TORCHRUN, kill_9_at_step_7, one_process, results, torchrun, two_processes

from hookscope.train import distributed

# Weights of 2 processes x batch 12 against 1 process x batch 24 after 10 SGD steps: the gradient average
# over ranks rounds differently from the mean over one batch (measured difference ~1.5e-8).
TOLERANCE = 1e-6

# several ranks on two cores: run alone (`make test`'s second part)
pytestmark = [pytest.mark.usefixtures("deterministic"), pytest.mark.serial]


# ---- in one process ----------------------------------------------------------------------------------


def test_one_process_is_rank_zero_of_one_and_reductions_return_their_input() -> None:
    assert (distributed.rank(), distributed.world_size(), distributed.is_rank_zero()) == (0, 1, True)
    assert not distributed.is_distributed()
    sums, count = torch.tensor([6.0, 3.0]), torch.tensor(3.0)
    assert distributed.weighted_means(sums, count).tolist() == [2.0, 1.0]
    flag = torch.tensor(True)
    assert distributed.any_rank(flag) is not None and bool(distributed.any_rank(flag))
    assert distributed.all_gather({"a": 1}) == [{"a": 1}]
    assert distributed.rank_zero_only(lambda x: x + 1)(1) == 2


def test_validation_shards_hold_every_sample_once_without_padding() -> None:
    shards = [list(distributed.ShardSampler(51, r, 2)) for r in range(2)]
    assert [len(s) for s in shards] == [26, 25]
    assert sorted(shards[0] + shards[1]) == list(range(51))


# ---- under torchrun ----------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_processes_train_as_one_process_with_the_same_global_batch(
    tmp_path: Path, whole_batch: dict
) -> None:
    two_processes(SCRIPT, tmp_path / "two", "--batch-size", "12")
    single = whole_batch
    rank0, rank1 = results(tmp_path / "two")
    assert (single["world"], rank0["world"]) == (1, 2)
    assert single["n_iter"] == rank0["n_iter"] == 5  # 120 samples: 5 batches of 24, or 5 of 12 per rank
    for name, weight in single["weights"].items():
        torch.testing.assert_close(rank0["weights"][name], weight, rtol=0, atol=TOLERANCE)
        assert torch.equal(rank0["weights"][name], rank1["weights"][name])
    for row, row0, row1 in zip(single["history"], rank0["history"], rank1["history"], strict=True):
        for key in ("train_loss", "valid_loss", "accuracy"):  # global, sample-weighted (shards 26 + 25)
            assert row0[key] == pytest.approx(row[key], abs=TOLERANCE)
            assert row0[key] == row1[key]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_statistics_are_reduced_to_those_of_the_whole_batch(tmp_path: Path) -> None:
    one_process(SCRIPT, tmp_path / "one", "--batch-size", "24", "--doctor")
    two_processes(SCRIPT, tmp_path / "two", "--batch-size", "12", "--doctor")
    (single,) = results(tmp_path / "one", nproc=1)
    rank0, rank1 = results(tmp_path / "two")
    assert list(rank0["stats"]) == ["0", "1", "2", "3"]  # the user's names: no DDP "module." prefix
    assert rank0["stats"] == rank1["stats"] and rank0["findings"] == rank1["findings"]
    for name, (count, mean, std, abs_max, nonfinite) in single["stats"].items():
        count2, mean2, std2, abs_max2, nonfinite2 = rank0["stats"][name]
        assert (count2, nonfinite2) == (count, nonfinite)  # 24 samples x features: both ranks' counts added
        assert (mean2, std2, abs_max2) == pytest.approx((mean, std, abs_max), abs=1e-6)


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_nan_on_one_rank_is_found_and_named_on_both(tmp_path: Path) -> None:
    done = two_processes(
        SCRIPT, tmp_path, "--doctor", "--fault", "nan", "--fault-rank", "1", "--fault-step", "3"
    )
    rank0, rank1 = results(tmp_path)
    assert rank0["guard"] == rank1["guard"]
    assert rank0["guard"]["step"] == 3 and rank0["guard"]["reason"] in {"activation", "loss"}
    assert rank0["guard"]["report"]["phase"] == "input" and rank0["guard"]["report"]["nan"] == 12 * 8
    assert rank0["findings"] == rank1["findings"]
    # the script's loader reads in order (no --shuffle): the Learner notes it, as info
    assert [f["kind"] for f in rank0["findings"] if f["severity"] != "info"] == ["nonfinite"]
    assert (done.stdout + done.stderr).count("Doctor [error] nonfinite") == 1  # printed by rank 0 only


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_an_error_on_one_rank_ends_both_with_the_error_printed_once(tmp_path: Path) -> None:
    start = time.monotonic()
    done = torchrun(str(SCRIPT), "--out", str(tmp_path), "--fault", "raise", "--fault-step", "3")
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert output.count("ValueError: injected failure on rank 1 at step 3") == 1, output
    assert time.monotonic() - start < 120
    assert not list(tmp_path.glob("rank*.pt"))


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_kill_9_then_resume_gives_the_uninterrupted_weights_bitwise(tmp_path: Path) -> None:
    options = ["--shuffle", "--dropout", "0.3", "--epochs", "3", "--every", "3"]
    two_processes(SCRIPT, tmp_path / "whole", *options, "--checkpoints", str(tmp_path / "ckpt-whole"))

    out, ckpt = tmp_path / "cut", tmp_path / "ckpt-cut"
    command = [*TORCHRUN, "--nproc-per-node=2"]
    command += [str(SCRIPT), "--out", str(out), *options, "--checkpoints", str(ckpt)]
    kill_9_at_step_7(command, out)
    saved = torch.load(ckpt / "last.pt", weights_only=True)
    assert saved["position"]["epoch"] == 1 and saved["position"]["iter"] == 1  # mid-epoch, step 6
    assert len(saved["ranks"]) == 2

    resumed = subprocess.run(
        [*command, "--resume"], capture_output=True, text=True, timeout=150, env=ENV, check=False
    )
    assert resumed.returncode == 0, resumed.stderr
    whole, cut = results(tmp_path / "whole"), results(out)
    for rank in range(2):
        for name, weight in whole[rank]["weights"].items():
            assert torch.equal(cut[rank]["weights"][name], weight), (rank, name)
        assert [r["train_loss"] for r in cut[rank]["history"]] == [
            r["train_loss"] for r in whole[rank]["history"]
        ]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ctrl_c_saves_on_every_rank_and_exits(tmp_path: Path) -> None:
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    command = [*TORCHRUN, "--nproc-per-node=2"]
    command += [str(SCRIPT), "--out", str(out), "--epochs", "3", "--checkpoints", str(ckpt), "--every", "100"]
    job = subprocess.Popen(
        [*command, "--pause-at", "7", "--pause-for", "3"],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    paused = [out / "paused0", out / "paused1"]
    deadline = time.monotonic() + 150
    while not all(p.exists() for p in paused) and time.monotonic() < deadline and job.poll() is None:
        time.sleep(0.1)
    job.send_signal(signal.SIGINT)  # what Ctrl-C in the terminal does: torchrun passes it to the ranks
    output, _ = job.communicate(timeout=120)
    assert job.returncode != 0
    assert output.count("hookscope: interrupted at epoch 2, step 8") == 1, output  # printed by rank 0
    saved = torch.load(ckpt / "last.pt", weights_only=True)
    assert saved["position"]["training_step"] == 8 and len(saved["ranks"]) == 2  # the same step on both

    resumed = subprocess.run(
        [*command, "--resume"], capture_output=True, text=True, timeout=150, env=ENV, check=False
    )
    assert resumed.returncode == 0, resumed.stderr
    assert [len(r["history"]) for r in results(out)] == [3, 3]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_hookscope_train_under_torchrun_writes_one_run_folder(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "ddp"
    done = torchrun("-m", "hookscope", "train", "--epochs", "1", "--out", str(run), timeout=350)
    assert done.returncode == 0, done.stdout + done.stderr
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["ddp"]
    assert (run / "report.html").is_file() and (run / "checkpoints" / "last.pt").is_file()
    assert done.stdout.count("report: ") == 1  # the closing words come from rank 0 only
    assert len(torch.load(run / "checkpoints" / "last.pt", weights_only=True)["ranks"]) == 2
