"""hookscope's Lightning callback under Lightning's own FSDP2 strategy, 2 processes on CPU (gloo)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.serial  # several ranks on two cores: run alone (`make test`'s second part)

pytest.importorskip("lightning")

SCRIPT = Path(__file__).with_name("lightning_fsdp_script.py")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_dead_layer_is_found_on_both_ranks_under_lightnings_model_parallel_strategy(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, str(SCRIPT), str(tmp_path)]  # Lightning starts rank 1 itself
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2))
    assert ("dead_units", "3", 0) in rank0["findings"]  # the user's module name: no wrapper prefix
    assert rank0["findings"] == rank1["findings"]
