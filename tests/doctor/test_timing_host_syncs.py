"""host_syncs: a training step that reads its loss with .item() is named by file and line on CUDA.

torch's sync debug mode needs a CUDA device; on the CPU its twin is torch's own warning text issued at the
line that reads a value (``synced`` below), with the mode switch recorded instead of set: the sampling,
the catching with the stack, the naming and hookscope's own syncs left out are the same code.
"""

import inspect
import traceback
import warnings

import pytest
import torch
from timing_loops import Feed, cnn, train
from torch import nn

from hookscope.doctor.timing import host_syncs as hs_syncs
from hookscope.doctor.timing.host_syncs import PROTOTYPE_NOTICE, SYNC_WARNING, SyncSampler

pytestmark = pytest.mark.serial  # they measure time: run alone (`make test`'s second part)


class TwinMode:
    """torch.cuda's sync debug mode as a value: what the sampler sets, and when; ``item`` reads a value
    as ``.item()`` does on CUDA, warning in the debug mode as torch does."""

    def __init__(self):
        self.mode, self.history = 0, []

    def set(self, mode):
        if mode == "warn" and not self.history:  # as torch does at its first switch into the mode
            warnings.warn(
                f"{PROTOTYPE_NOTICE} and does not yet detect all synchronizing operations", stacklevel=2
            )
        self.mode = mode
        self.history.append(mode)

    def get(self):
        return self.mode

    def item(self, loss):
        if self.mode == "warn":
            warnings.warn(SYNC_WARNING, UserWarning, stacklevel=1)
        return loss.item()


SYNC_LINE = inspect.getsourcelines(TwinMode.item)[1] + 2


def run_steps(sampler, mode, steps, syncs_per_step=2):
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    for step in range(steps):
        sampler.begin(step)
        loss = model(torch.randn(8, 4)).pow(2).mean()
        for _ in range(syncs_per_step):
            mode.item(loss)
        sampler.end()


def twin(warmup=0):
    mode = TwinMode()
    sampler = SyncSampler(warmup, set_mode=mode.set, get_mode=mode.get)
    sampler.active = True
    return sampler, mode


def test_a_few_steps_after_warm_up_are_sampled_and_the_mode_is_restored_after_each():
    sampler, mode = twin(warmup=10)
    assert [s for s in range(200) if sampler.sampled(s)] == [10, 30, 50]
    run_steps(sampler, mode, 60)
    assert mode.history == ["warn", 0, "warn", 0, "warn", 0]
    assert sorted(sampler.samples) == [10, 30, 50]


def test_torchs_notice_at_the_samplers_first_switch_does_not_reach_the_user():
    sampler, mode = twin()
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        run_steps(sampler, mode, 1)
    assert mode.history == ["warn", 0]
    assert shown == []


def test_syncs_are_named_by_the_users_file_and_line():
    sampler, mode = twin()
    run_steps(sampler, mode, 50)
    finding = sampler.finding()
    assert finding.kind == "host_syncs" and finding.step == 40
    assert finding.evidence["counts"] == [2, 2, 2]
    site = f"{__file__}:{SYNC_LINE}"
    assert finding.evidence["sites"] == {site: 2.0}
    assert f"{site} `warnings.warn(SYNC_WARNING, UserWarning, stacklevel=1)` (2 per step)" in finding.message
    assert "wait for the GPU 2 times (sampled steps 0, 20, 40)" in finding.message
    assert ".item()" in finding.message and "non_blocking=True" in finding.message


def test_other_warnings_still_reach_the_user_during_a_sampled_step():
    sampler, _ = twin()
    sampler.begin(0)
    with pytest.warns(UserWarning, match="something else"):
        warnings.warn("something else", UserWarning, stacklevel=1)
    sampler.end()
    assert sum(sampler.samples[0].values()) == 0


def test_hookscope_and_the_grad_scalers_syncs_are_left_out_and_torch_frames_skipped():
    sampler, _ = twin()
    user = traceback.FrameSummary("/home/me/train.py", 42, "main")
    inside_torch = traceback.FrameSummary(f"{hs_syncs.TORCH}/_tensor.py", 10, "item")
    doctor = traceback.FrameSummary(f"{hs_syncs.HOOKSCOPE}/doctor/engine.py", 300, "check")
    sampler.begin(0)
    sampler.record([user, inside_torch])  # the user's .item(), inside torch
    sampler.record([user, doctor, inside_torch])  # the doctor's bulk read, called from the user's step
    scaler = traceback.FrameSummary(hs_syncs.GRAD_SCALER, 450, "_maybe_opt_step")
    sampler.record([user, scaler, inside_torch])  # scaler.step(opt): fp16 training's one read a step
    sampler.end()
    assert dict(sampler.samples[0]) == {("/home/me/train.py", 42): 1}


def test_a_step_without_syncs_and_the_cpu_are_silent():
    sampler, mode = twin()
    run_steps(sampler, mode, 50, syncs_per_step=0)
    assert sampler.finding() is None
    cpu = SyncSampler(0)  # not active: the mode is never touched (it needs a CUDA device)
    cpu.begin(0)
    cpu.end()
    assert cpu.samples == {} and cpu.finding() is None


@pytest.mark.cuda
def test_on_cuda_a_value_read_in_the_step_is_named():
    model = cnn().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    feed = Feed(model, opt, warmup=2)
    x, y = torch.randn(32, 1, 16, 16, device="cuda"), torch.randint(0, 10, (32,), device="cuda")
    line = inspect.currentframe().f_lineno + 1
    train(model, opt, feed, [(x, y)], 50, lambda step: x.sum().item())  # the sync, before each forward
    finding = {f.kind: f for f in feed.close()}["host_syncs"]
    assert finding.evidence["sites"] == {f"{__file__}:{line}": 1.0}
    assert torch.cuda.get_sync_debug_mode() == 0
