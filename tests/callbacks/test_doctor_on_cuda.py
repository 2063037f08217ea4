"""The Learner with its default callbacks, and with the Doctor, on a GPU: what syncs the host in a step.

Under ``torch.cuda.set_sync_debug_mode("warn")`` every synchronising call warns, attributed to the Python
line that made it. The calls of training steps 31 to 38 are caught: those steps are neither recorded (the
warm-up is steps 0-4, then every 50th), nor checked (the rules read their values in one bulk transfer at
the end of steps 24 and 44: once per check, by design), nor sampled by the Doctor's own ``host_syncs``
probe (steps 10, 30 and 50). ``progress=False``: a displayed bar reads the smoothed loss at most every
0.5 s, whichever step that falls in.

The Doctor's guard hands its flag to the Learner's default optimizer (AdamW, fused on CUDA), which leaves a
non-finite update out on the device, and reads it a step late, when the device is done with it: no sync.
With an optimizer that cannot skip a step on the device it reads one value per step, just before
``opt.step()``: the price of stopping a non-finite update before it lands (docs/doctor.md#nonfiniteguard).
These tests pin both, and that nothing else in the loop or the Doctor syncs.
"""

from collections import Counter
from functools import partial
from pathlib import Path

import pytest
import torch
from cuda_syncs import FIRST, LAST, SyncWindow, small_cnn
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hookscope as hs
from hookscope.doctor import guard

pytestmark = pytest.mark.cuda


class SyncTrap(hs.Callback):
    """Every host sync of training steps ``FIRST`` to ``LAST``, by the file and line that made it."""

    order = -1000  # first in every event: the window holds all of each step

    def __init__(self) -> None:
        self.window = SyncWindow()

    @property
    def sites(self) -> Counter[tuple[str, int]]:
        return self.window.sites

    def before_batch(self) -> None:
        if not self.learn.training:
            return
        if self.learn.training_step == FIRST:
            self.window.open()
        elif self.learn.training_step == LAST + 1:
            self.window.close()

    def after_fit(self) -> None:
        self.window.close()

    def on_failure(self, exc: BaseException) -> None:
        self.window.close()  # a failed fit leaves neither the debug mode nor the warning filters behind


def fit_on_cuda(*cbs: hs.Callback, opt_func=torch.optim.AdamW) -> SyncTrap:
    """One epoch of 40 steps of a small CNN on shuffled in-memory data, on the GPU, with ``cbs``."""
    torch.manual_seed(0)
    x, y = torch.randn(64 * 40, 1, 16, 16), torch.randint(0, 10, (64 * 40,))
    train = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True)
    valid = DataLoader(TensorDataset(x[:64], y[:64]), batch_size=64)
    model = small_cnn()
    trap = SyncTrap()
    learn = hs.Learner(
        model,
        hs.DataLoaders(train, valid),
        nn.CrossEntropyLoss(),
        opt_func,
        lr=1e-3,
        cbs=[trap, *cbs],
        device="cuda",
        progress=False,
    )
    learn.fit(1)
    assert torch.cuda.get_sync_debug_mode() == 0
    return trap


def test_the_learner_with_its_default_callbacks_makes_no_host_sync_in_a_step():
    assert fit_on_cuda().sites == Counter()


def test_the_doctor_without_its_guard_makes_no_host_sync_in_a_step():
    assert fit_on_cuda(hs.callbacks.Doctor(quiet=True, guard=False)).sites == Counter()


def test_the_doctor_with_its_guard_makes_no_host_sync_in_a_step():
    assert fit_on_cuda(hs.callbacks.Doctor(quiet=True)).sites == Counter()


def test_with_an_optimizer_that_cannot_skip_a_step_the_guard_makes_the_one_host_sync_of_a_step():
    unfused = partial(torch.optim.AdamW, fused=False)
    sites = fit_on_cuda(hs.callbacks.Doctor(quiet=True), opt_func=unfused).sites
    assert {Path(file) for file, _ in sites} == {Path(guard.__file__)}  # its read before opt.step()
    assert sum(sites.values()) == LAST - FIRST + 1


def test_a_nan_on_the_gpu_is_stopped_a_step_late_with_the_weights_before_it():
    class Poison(hs.Callback):
        order = 5  # before the guard's check

        def before_step(self):
            if self.learn.training_step == 25:
                next(self.learn.model.parameters()).grad[0] = float("nan")

    doctor = hs.callbacks.Doctor(quiet=True)
    fit_on_cuda(doctor, Poison())
    assert (doctor.guard.stopped_at, doctor.guard.reason) == (25, "gradient")
    assert all(p.isfinite().all() for p in doctor.learn.model.parameters())
