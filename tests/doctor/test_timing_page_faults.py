"""``page_faults``: a process whose allocator gives back what each step frees, and faults it in again in
the next, is named with the fix; a leak, a loader that reads files and a calm process are not. The real
runs are fresh processes, the allocator set from the environment (glibc's ``MALLOC_MMAP_THRESHOLD_``):
the test process itself keeps freed memory (tests/conftest.py)."""

import json
import os
import platform
import subprocess
import sys

import numpy as np
import pytest

from hookscope.doctor.timing.page_faults import FAULTS, FIX, KERNEL, MIN_FAULTS, page_faults
from hookscope.doctor.timing.phases import BACKWARD, COLUMNS, DATA, FORWARD
from hookscope.doctor.timing.slowdown import Slowdown

pytestmark = pytest.mark.serial  # they measure time: run alone (`make test`'s second part)


glibc = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc"
)


def steps_of(n=60, kernel=0.004, faults=2000, data=0.001, step=0.020):
    """``n`` steps of ``step`` seconds (``data`` of it waiting for the batch), each with ``kernel`` seconds
    in the kernel and ``faults`` page faults."""
    rows = np.zeros((n, len(COLUMNS)))
    rows[:, DATA], rows[:, FORWARD], rows[:, BACKWARD] = data, (step - data) / 2, (step - data) / 2
    counters = np.zeros((n, 2))
    counters[:, KERNEL], counters[:, FAULTS] = kernel, faults
    return np.arange(10, 10 + n), rows, counters


def flat_memory(steps, per_step=0.0):
    return steps[::4], 500e6 + per_step * steps[::4].astype(float)


def test_steps_that_fault_in_what_the_last_one_freed_are_named_with_the_fix():
    steps, rows, counters = steps_of()
    finding = page_faults(steps, rows, counters, *flat_memory(steps))
    assert finding.kind == "page_faults" and finding.severity == "warning" and finding.module == ""
    assert finding.step == 29  # the 20 steps the rule needs at least
    assert finding.evidence == {
        "faults_per_step": 2000.0,
        "kernel_ms": 4.0,
        "step_ms": 20.0,
        "share": 0.2,
        "memory_growth_per_step": 0.0,
    }
    assert finding.message.startswith(
        "each training step takes 2,000 page faults (7.8 MB) and spends 20% of its time in the kernel "
        "(median 4.0 ms of 20.0 ms, steps 10-69), while the memory in use stays flat"
    )
    assert f"start Python with {FIX} in its environment" in finding.message
    assert "or call hookscope.doctor.timing.keep_freed_memory() before training" in finding.message


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"faults": MIN_FAULTS - 1}, "few faults"),
        ({"kernel": 0.0015}, "under a tenth of the step in the kernel"),
        ({"data": 0.006, "kernel": 0.005}, "the loader's reads: no more kernel time than the data phase"),
        ({"n": 19}, "too few steps"),
    ],
)
def test_a_process_that_faults_little_or_in_its_loader_is_not_named(change, why):
    steps, rows, counters = steps_of(**change)
    assert page_faults(steps, rows, counters, *flat_memory(steps)) is None, why


def test_memory_that_grows_by_what_is_faulted_is_a_leak_not_the_allocator():
    steps, rows, counters = steps_of()
    faulted = 2000 * os.sysconf("SC_PAGE_SIZE")
    assert page_faults(steps, rows, counters, *flat_memory(steps, per_step=faulted)) is None
    assert page_faults(steps, rows, counters, *flat_memory(steps, per_step=0.05 * faulted)) is not None


def test_steps_slowed_by_faults_in_every_layer_are_no_slowdown_of_the_compute():
    steps, rows, counters = steps_of(n=160, kernel=0.0, faults=0)
    rows[60:, BACKWARD] += 0.020  # from step 70, 20 ms more a step: all of it in the kernel
    counters[60:, KERNEL] = 0.020
    blind, slowdown = Slowdown(), Slowdown()
    ends = range(40, 161, 10)  # a growth is seen at two checks whose latest 32 steps do not overlap
    assert any(blind.check(steps[:end], rows[:end]) for end in ends)  # without the counters: a growth
    assert not any(slowdown.check(steps[:end], rows[:end], kernel=counters[:end, KERNEL]) for end in ends)
    counters[:, KERNEL] = 0.004  # a steady kernel share: the compute's own growth is still one
    steady = Slowdown()
    assert any(steady.check(steps[:end], rows[:end], kernel=counters[:end, KERNEL]) for end in ends)


TRAIN = """
import json, sys
import torch
from torch import nn
import hookscope as hs
from hookscope.doctor.timing import keep_freed_memory

if sys.argv[1] == "keep":
    assert keep_freed_memory()
torch.set_num_threads(1)


def fit(loop):
    torch.manual_seed(0)
    x, y = torch.randn(64 * 40, 1, 28, 28), torch.randint(0, 10, (64 * 40,))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=64, shuffle=True)
    model = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
        nn.Flatten(), nn.Linear(32 * 28 * 28, 10),
    )
    if loop == "learner":
        doctor = hs.callbacks.Doctor(quiet=True)
        hs.Learner(model, (loader, None), nn.CrossEntropyLoss(), lr=1e-3, cbs=[doctor], progress=False).fit(3)
        return doctor.findings
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with hs.watch(model, opt, quiet=True) as w:
        for _ in range(3):
            for xb, yb in loader:
                opt.zero_grad()
                loss = nn.functional.cross_entropy(model(xb), yb)
                w.log(loss, yb)
                loss.backward()
                opt.step()
    return w.findings


print(json.dumps({loop: {f.kind: f.evidence for f in fit(loop)} for loop in ("learner", "watch")}))
"""
UNMAPPING = {"MALLOC_MMAP_THRESHOLD_": "65536"}  # every block over 64 KB mapped, and unmapped when freed


def run(keep, env):
    """The findings of a Learner's fit, then of a loop under ``hs.watch``, in one fresh process (a launch
    costs as much as a fit) with ``env``; ``keep``: keep_freed_memory() called first."""
    out = subprocess.run(
        [sys.executable, "-c", TRAIN, keep],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def processes():
    """Both loops in the three processes: unmapping as is, unmapping with the fix called first, and in the
    environment the message gives."""
    fixed = dict(setting.split("=") for setting in FIX.split())
    return {"as is": run("as is", UNMAPPING), "keep": run("keep", UNMAPPING), "fixed": run("as is", fixed)}


@glibc
@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("loop", ["learner", "watch"])
def test_a_process_whose_malloc_unmaps_each_steps_memory_is_named_and_keep_freed_memory_ends_it(
    processes, loop
):
    found = processes["as is"][loop]
    assert "page_faults" in found, found
    assert found["page_faults"]["faults_per_step"] >= MIN_FAULTS and found["page_faults"]["share"] >= 0.1
    assert "slow_layers" not in found
    assert "page_faults" not in processes["keep"][loop]  # the same process, the fix called first
    assert "page_faults" not in processes["fixed"][loop]  # the environment the message gives
