"""``hs.watch`` in a hand-written loop on a GPU: what syncs the host in a step.

As ``tests/callbacks/test_doctor_on_cuda.py`` does for the Learner: the syncs of optimizer steps 31 to
38 are caught. Those steps are neither recorded (steps 0-4, then every 50th), nor checked (the rules
read their values in one bulk transfer at the end of steps 4, 24, 44, ...), nor sampled by the
``host_syncs`` probe (steps 10, 30 and 50). The loop itself reads nothing: its data is on the device,
its batches are taken with a permutation on the device, and the loss goes to ``w.log`` with the targets
(the label mix copies them into a device ring).
"""

from pathlib import Path

import pytest
import torch
from cuda_syncs import FIRST, LAST, SyncWindow, small_cnn
from torch import nn

import hookscope as hs
from hookscope.doctor import guard

pytestmark = pytest.mark.cuda

STEPS, BATCH = 40, 64


def train_watched(fused: bool = False, **options: object) -> SyncWindow:
    """``STEPS`` optimizer steps of a small CNN on the GPU under ``hs.watch(model, opt, **options)``."""
    torch.manual_seed(0)
    model = small_cnn().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=fused)
    x = torch.randn(BATCH * STEPS, 1, 16, 16, device="cuda")
    y = torch.randint(0, 10, (BATCH * STEPS,), device="cuda")
    order = torch.randperm(BATCH * STEPS, device="cuda")
    window = SyncWindow()
    try:
        with hs.watch(model, opt, quiet=True, **options) as w:
            for step in range(STEPS):
                if step == FIRST:
                    window.open()
                elif step == LAST + 1:
                    window.close()
                batch = order[BATCH * step : BATCH * (step + 1)]
                opt.zero_grad()
                loss = nn.functional.cross_entropy(model(x[batch]), y[batch])
                w.log(loss, target=y[batch])
                loss.backward()
                opt.step()
    finally:
        window.close()  # a failing loop leaves neither the debug mode nor the warning filters behind
    assert w.step == STEPS and torch.cuda.get_sync_debug_mode() == 0
    return window


def test_hs_watch_at_its_defaults_makes_no_host_sync_in_a_step():
    assert train_watched().sites == {}


def test_hs_watch_with_its_guard_makes_the_one_host_sync_of_a_step():
    sites = train_watched(guard=True).sites
    assert {Path(file) for file, _ in sites} == {Path(guard.__file__)}  # its read in the step pre-hook
    assert sum(sites.values()) == LAST - FIRST + 1


def test_hs_watch_with_its_guard_and_a_fused_optimizer_makes_no_host_sync_in_a_step():
    assert train_watched(fused=True, guard=True).sites == {}  # the guard's flag is read a step late
