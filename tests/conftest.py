"""Shared fixtures: one ResNet34 and one ResNet18 (random weights, eval mode), the bundled sample image,
and deterministic algorithms for the tests that compare resumed runs bitwise. Tests marked ``cuda`` are
skipped where no CUDA device is present.

Building a ResNet costs about a second, so each is built once per test session. Tests must not change
their weights or mode; a test that needs to, builds its own.
"""

import os

import pytest
import torch
from torchvision.models import resnet18, resnet34

from hookscope.data.images import sample_image
from hookscope.doctor.timing import keep_freed_memory


def pytest_configure(config: pytest.Config) -> None:
    """The test process keeps the memory a training step frees, as the ``page_faults`` finding advises:
    the healthy runs assert that the model and the loop give no finding, and a process whose allocator
    faults every step is the allocator's doing (tested apart, in fresh processes:
    tests/doctor/test_timing_page_faults.py). The suite runs faster too.

    Under ``make test``'s two workers (pytest-xdist), each worker and the processes it starts compute on one
    thread: two workers of two OpenMP threads each on two cores spin waiting for each other."""
    keep_freed_memory()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the ``cuda`` tests without a CUDA device (they run, with ``-m cuda``, where a GPU is lent)."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def resnet34_eval() -> torch.nn.Module:
    torch.manual_seed(0)
    return resnet34(weights=None).eval()


@pytest.fixture(scope="session")
def resnet18_eval() -> torch.nn.Module:
    torch.manual_seed(0)
    return resnet18(weights=None).eval()


@pytest.fixture(scope="session")
def china_224() -> torch.Tensor:
    """scikit-learn's bundled china.jpg as (1, 3, 224, 224) in [0, 1]: the seed article's input."""
    return sample_image(224)


@pytest.fixture(scope="session")
def china_64() -> torch.Tensor:
    """The same photo at 64×64: a ResNet forward ~12× cheaper, for behaviour rather than the seed's shapes."""
    return sample_image(64)


@pytest.fixture
def deterministic():
    """torch's deterministic algorithms for one test (bitwise-equal resume), then the previous setting."""
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(previous)
