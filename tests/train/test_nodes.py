"""Several nodes: two torchrun launchers (``--nnodes 2 --nproc-per-node 1``) meet at a c10d rendezvous on
127.0.0.1, as two machines would at their master's address. Each test has a timeout: no hang."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from launch import ENV, SCRIPT

pytestmark = pytest.mark.serial  # several ranks on two cores: run alone (`make test`'s second part)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def two_nodes(*args: str, timeout: float = 300) -> list[subprocess.CompletedProcess[str]]:
    """Run ``args`` under two torchrun launchers, nodes 0 and 1 of one job, until both end."""
    port = free_port()
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1"]
    launcher += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "nodes"]
    jobs = [
        subprocess.Popen(
            [*launcher, "--node-rank", str(node), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=ENV,
        )
        for node in (0, 1)
    ]
    done = []
    try:
        for job in jobs:
            stdout, stderr = job.communicate(timeout=timeout)
            done.append(subprocess.CompletedProcess(job.args, job.returncode, stdout, stderr))
    finally:
        for job in jobs:  # a launcher left waiting after a failed test must not outlive it
            if job.poll() is None:
                job.kill()
                job.wait()
    return done


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_two_nodes_train_with_global_ranks_and_identical_findings(tmp_path: Path) -> None:
    nodes = two_nodes(str(SCRIPT), "--out", str(tmp_path), "--doctor")
    for node in nodes:
        assert node.returncode == 0, node.stdout + node.stderr
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2))
    assert rank0["world"] == rank1["world"] == 2
    assert rank0["n_iter"] == rank1["n_iter"] == 5  # 120 samples split over the two nodes, 12 per batch
    assert rank0["findings"] == rank1["findings"]
    for name, weight in rank0["weights"].items():
        assert torch.equal(rank1["weights"][name], weight)


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_hookscope_train_on_two_nodes_writes_one_run_folder_and_one_report(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "nodes"
    nodes = two_nodes("-m", "hookscope", "train", "--epochs", "1", "--out", str(run), timeout=450)
    for node in nodes:
        assert node.returncode == 0, node.stdout + node.stderr
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["nodes"]
    assert (run / "report.html").is_file()
    assert sum(node.stdout.count("report: ") for node in nodes) == 1  # from global rank 0 only
    assert len(torch.load(run / "checkpoints" / "last.pt", weights_only=True)["ranks"]) == 2


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_node_that_dies_ends_the_job_on_the_other_node(tmp_path: Path) -> None:
    start = time.monotonic()
    nodes = two_nodes(
        str(SCRIPT), "--out", str(tmp_path), "--fault", "kill", "--fault-step", "3", timeout=240
    )
    assert [node.returncode != 0 for node in nodes] == [True, True]
    # the rendezvous picks which node hosts global rank 1: look at both nodes' output
    assert "PeerFailedError: rank 0 stopped because another rank failed" in nodes[0].stderr + nodes[1].stderr
    assert time.monotonic() - start < 200  # long before the process group's 5-minute timeout
    assert not list(tmp_path.glob("rank*.pt"))
