"""slow_layers: on request, a short profiled window names the module that takes most of the forward and
backward time, with its share and the fix for its type; the profiler and the hooks are gone afterwards; a
run that did not ask is profiled only when its steps' own compute grew well beyond its start."""

import time
from itertools import pairwise

import numpy as np
import pytest
import torch
from faults import kinds, train_with_doctor
from timing_loops import Feed, cnn, in_memory, train
from torch import nn

from hookscope.doctor.timing import TimingRecorder
from hookscope.doctor.timing.phases import BACKWARD, COLUMNS, DATA, FORWARD, WAIT
from hookscope.doctor.timing.slow_layers import slow_layers
from hookscope.doctor.timing.slowdown import Slowdown

pytestmark = pytest.mark.serial  # they measure time: run alone (`make test`'s second part)


def heavy_conv_net() -> nn.Sequential:
    """A wide 5x5 convolution between two cheap layers: most of every step's compute."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 4, 1),
        nn.Conv2d(4, 64, 5, padding=2),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, 10),
    )


def profiled_run(steps=30, warmup=5, window=3, request=True):
    torch.set_num_threads(1)
    model = heavy_conv_net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    feed = Feed(model, opt, warmup=warmup)
    if request:
        feed.recorder.profile_layers(window)
    train(model, opt, feed, in_memory(), steps)
    return model, feed, feed.close()


def test_the_module_taking_most_of_the_time_is_named_with_its_share_and_fix():
    _, _, found = profiled_run()
    (finding,) = [f for f in found if f.kind == "slow_layers"]
    assert finding.module == "1"
    assert finding.evidence["steps"] == [5, 6, 7]  # the window opens when the warm-up is over
    shares = finding.evidence["shares"]
    assert next(iter(shares)) == "1" and shares["1"] >= 0.5
    assert set(finding.evidence["ms_per_step"]) == {"0", "1", "2", "3", "4", "5"}
    assert finding.message.startswith(f"`1` (Conv2d) takes {shares['1']:.0%} of the forward and backward")
    assert "profiled steps 5-7" in finding.message and "channels_last" in finding.message
    assert finding.severity == "info"


def test_nothing_stays_on_after_the_window():
    model, _, _ = profiled_run()
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model)
    with torch.profiler.profile():  # torch refuses a second profiler while one is running
        pass


def test_a_run_that_did_not_ask_is_not_profiled():
    _, feed, found = profiled_run(request=False)
    assert "slow_layers" not in {f.kind for f in found}
    assert feed.recorder.slow_layers.profiled == []


def test_a_window_cut_short_by_the_end_of_the_run_counts_the_steps_it_saw():
    _, _, found = profiled_run(steps=7, warmup=5, window=5)
    (finding,) = [f for f in found if f.kind == "slow_layers"]
    assert finding.evidence["steps"] == [5, 6]


def test_shares_name_the_fewest_modules_that_cover_half_the_time():
    times = {"enc": 0.03, "attn": 0.04, "head": 0.02, "norm": 0.01}
    kinds = {"enc": "Linear", "attn": "MultiheadAttention", "head": "Linear", "norm": "LayerNorm"}
    finding = slow_layers(times, kinds, [10, 11, 12])
    assert finding.evidence["shares"] == {"attn": 0.4, "enc": 0.3}
    assert finding.message.startswith("`attn` (MultiheadAttention) and `enc` (Linear) take 40% and 30% of")
    assert "scaled_dot_product_attention" in finding.message and "torch.autocast" in finding.message
    assert slow_layers({}, {}, [1]) is None


def test_a_bad_window_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"steps=0; profile at least one step \(steps >= 1\)"):
        TimingRecorder().profile_layers(0)


def test_doctor_profile_true_names_the_widest_layer_in_the_learner():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    widths = [64, 16, 1024, 1024, 10]  # layer `4` (1024 x 1024) makes 97% of the multiplications
    layers = [m for a, b in pairwise(widths) for m in (nn.Linear(a, b), nn.ReLU())]
    model = nn.Sequential(*layers[:-1])
    learn = train_with_doctor(model, steps=20, profile=True)
    (finding,) = kinds(learn)["slow_layers"]
    assert finding.module == "4" and finding.evidence["steps"] == [10, 11, 12, 13, 14]
    assert "`4` (Linear)" in finding.message and "torch.autocast" in finding.message
    assert "slow_layers" not in kinds(train_with_doctor(model, steps=20))  # not asked: not profiled


class Recall(nn.Module):
    """Attends over every input it has seen in training: a history that grows at every step (detached),
    so each step costs more than the one before."""

    def __init__(self, width=512):
        super().__init__()
        self.seen = torch.empty(0, width)

    def forward(self, x):
        if self.training:
            self.seen = torch.cat([self.seen, x.detach()])
        return (x @ self.seen.T).softmax(-1) @ self.seen


def test_steps_that_grow_slower_are_profiled_by_themselves():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(256, 512), Recall(), nn.ReLU(), nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    feed = Feed(model, opt)
    train(model, opt, feed, in_memory(), 220)
    (finding,) = [f for f in feed.close() if f.kind == "slow_layers"]
    assert finding.module == "2" and finding.severity == "info"
    growth = finding.evidence["growth"]
    assert growth["reference_steps"] == [10, 41] and growth["now_ms"] >= 1.5 * growth["before_ms"]
    assert finding.message.startswith("The steps' forward, backward and optimizer grew from")
    assert "profiled to see where the time goes now. `2` (Recall) takes" in finding.message
    assert "a cache, a history or a memory kept across steps (bound it)" in finding.message
    assert finding.evidence["steps"][0] > growth["by_step"]  # the window opened after the growth was seen
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model[1:])  # nothing stays on


def synthetic(n=120, grow=None, wait=0.0):
    """``n`` steps of 10 ms compute and 2 ms data; from step 60 on ``grow`` (a phase) takes 20 ms more,
    of which ``wait`` seconds the threads waited for a core."""
    rows = np.zeros((n, len(COLUMNS)))
    rows[:, FORWARD], rows[:, DATA] = 0.010, 0.002
    if grow is not None:
        rows[60:, grow] += 0.020
        rows[60:, WAIT] = wait
    return np.arange(10, 10 + n), rows


@pytest.mark.parametrize(
    ("grow", "wait", "parallel", "found"),
    [
        (None, 0.0, False, False),
        (DATA, 0.0, False, False),
        (BACKWARD, 0.019, False, False),
        (BACKWARD, 0.012, True, False),
        (BACKWARD, 0.012, False, True),
        (BACKWARD, 0.0, True, True),
    ],
    ids=[
        "flat",
        "the loader grew",
        "the machine got busy",
        "busy, a pool's threads wait in turn",
        "busy, one thread's own time grew",
        "the compute grew",
    ],
)
def test_only_a_growth_of_the_steps_own_compute_is_a_slowdown(grow, wait, parallel, found):
    steps, rows = synthetic(grow=grow, wait=wait)
    slowdown = Slowdown()
    seen = [slowdown.check(steps[:end], rows[:end], parallel) for end in range(40, 121, 10)]
    growth = next((g for g in seen if g is not None), None)
    assert (growth is not None) == found
    if found:
        # 20 of the latest 32 grew by step 89; seen again in steps 98-129, which do not overlap them
        assert (growth.first, growth.last, growth.seen) == (10, 41, 129)
        assert growth.before == pytest.approx(0.010) and growth.now == pytest.approx(0.030 - wait)
        assert seen.count(growth) == 1  # found once
        resumed = Slowdown()  # from a checkpoint: found once over the resumed run too
        resumed.load_state_dict(slowdown.state_dict())
        assert (resumed.reference, resumed.growth) == (slowdown.reference, growth)
        assert resumed.check(steps, rows) is None


def test_a_slow_spell_gone_by_the_next_check_is_no_growth():
    """Steps 70-109 took 20 ms more (another process on the machine's shared core, invisible as a wait):
    the latest steps of one check grew, those of the next check, which do not overlap them, did not."""
    steps, rows = synthetic(n=160, grow=BACKWARD)
    rows[100:, BACKWARD] = 0.0
    slowdown = Slowdown()
    assert [slowdown.check(steps[:end], rows[:end]) for end in range(40, 161, 10)] == [None] * 13
    assert slowdown.suspected is None  # the spell was suspected at step 89, and dropped at step 129


class Neighbour(nn.Module):
    """Adds ``extra`` seconds of computing to every training forward from call ``start`` on — until the
    profiler's hooks reach it when ``ends`` (another process that shared the core, then left)."""

    def __init__(self, start=60, extra=0.006, ends=True):
        super().__init__()
        self.start, self.extra, self.ends = start, extra, ends
        self.calls, self.gone = 0, False

    def forward(self, x):
        self.calls += 1
        self.gone = self.gone or (self.ends and bool(self._forward_pre_hooks))
        if self.training and self.calls > self.start and not self.gone:
            until = time.perf_counter() + self.extra
            while time.perf_counter() < until:  # on the core, as a neighbour's share of it looks
                pass
        return x


@pytest.mark.parametrize("ends", [True, False], ids=["ended by the profile", "still there"])
def test_a_slowdown_gone_by_the_time_it_is_profiled_is_not_reported(ends):
    torch.set_num_threads(1)
    neighbour = Neighbour(ends=ends)
    model = nn.Sequential(neighbour, *cnn())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    feed = Feed(model, opt)
    train(model, opt, feed, in_memory(), 220)
    found = [f for f in feed.close() if f.kind == "slow_layers"]
    assert feed.recorder.slowdown.growth is not None  # the growth was seen, and the window opened
    assert len(feed.recorder.slow_layers.profiled) == 5
    assert neighbour.gone == ends
    if ends:
        assert found == []
    else:
        (finding,) = found  # the neighbour's 6 ms are the growth, and it takes the time
        growth = finding.evidence["growth"]
        # the CNN's own 3-4 ms ran 1 ms slower at the reference than late in the run once (4.2 ms, then
        # 8.9 with the neighbour's 6): the growth is most of the 6 ms, not all of it
        assert finding.module == "0" and growth["now_ms"] - growth["before_ms"] >= 4


def test_the_profiled_steps_and_those_after_them_tell_whether_a_growth_holds():
    steps, rows = synthetic(n=160, grow=BACKWARD)
    slowdown = Slowdown()
    assert slowdown.holds(steps, rows, [100, 101]) is None  # no reference yet
    assert slowdown.check(steps[:80], rows[:80]) is None  # seen first, at step 89
    assert slowdown.check(steps[:120], rows[:120]) is not None  # still there in steps 98-129
    assert slowdown.holds(steps, rows, [100, 101, 102])  # 30 ms against 10, and so are steps 103-134
    assert slowdown.holds(steps, rows, [50, 51, 52]) is False  # before the growth
    assert slowdown.holds(steps[:92], rows[:92], [101, 102]) is None  # step 102 not read yet
    assert slowdown.holds(steps[:120], rows[:120], [100, 101, 102]) is None  # nor all of the steps after it
    kernel = np.where(steps >= 100, 0.025, 0.0)  # from step 100 on the allocator's faults took the time
    assert slowdown.holds(steps, rows, [100, 101, 102], kernel) is False
    ended = rows.copy()
    ended[steps >= 110, BACKWARD] = 0.0  # gone soon after the window: slow under the profiler, not after it
    assert slowdown.holds(steps, ended, [100, 101, 102]) is False
