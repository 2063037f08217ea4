import pytest
from launch import SCRIPT, one_process, results


@pytest.fixture(scope="session")
def whole_batch(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """distributed_script.py in one process on batches of 24: what 2 ranks on batches of 12 must match,
    under DDP and FSDP2 alike. One run (5 s) for every test that compares with it."""
    out = tmp_path_factory.mktemp("whole-batch")
    one_process(SCRIPT, out, "--batch-size", "24")
    (single,) = results(out, nproc=1)
    return single
