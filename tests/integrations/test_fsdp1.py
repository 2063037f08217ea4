"""hs.watch (and the integrations built on it) and the Learner refuse a model wrapped with FSDP1: 2
processes, gloo."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.serial  # several ranks on two cores: run alone (`make test`'s second part)

SCRIPT = Path(__file__).with_name("fsdp1_script.py")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_fsdp1_wrapped_model_is_refused_in_one_line_on_both_ranks(tmp_path: Path) -> None:
    """FSDP1 runs on the CPU here, but its flat parameters would give ``_fsdp_wrapped_module.`` names and one
    rank's flattened slice as a layer's gradient: refused, naming FSDP2 as the fix, before any hook."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    command = [*torchrun, str(SCRIPT), str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2))
    around_root, inner, learner = rank0["messages"]
    assert "FSDP1" in around_root and "around the whole model" in around_root
    assert "at '0'" in inner  # the user's module inside the root wrapper: its first wrapped Linear
    assert "fully_shard" in around_root and "\n" not in around_root
    assert learner.startswith("Learner: the model holds an FSDP1") and "Learner(shard=True)" in learner
    assert rank0 == rank1
    assert rank0["hooks"] == 0
