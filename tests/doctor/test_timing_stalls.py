"""step_stalls: a loop that stalls 0.3 s every 25th step is named with its period; the collector and a
noted checkpoint are named when they run in the stalls; a healthy loop and a slow start are silent."""

import gc
import time

import numpy as np
import pytest
import torch
from timing_loops import Feed, cnn, in_memory, run, stall_every, train

from hookscope.doctor.timing.phases import COLUMNS, PHASES
from hookscope.doctor.timing.stalls import CHECKPOINT_SAVE, Stall, carrying, isolated, period, step_stalls

pytestmark = pytest.mark.serial  # they measure time: run alone (`make test`'s second part)


def test_a_periodic_stall_is_found_with_its_period():
    found = {f.kind: f for f in run(in_memory(), 110, stall_every(25, 0.3)).close()}
    assert set(found) == {"step_stalls"}
    finding = found["step_stalls"]
    assert finding.evidence["period"] == 25
    # a shared machine may add a slow step of its own between them (step 60 of one run here)
    assert {25, 50, 75, 100} <= set(finding.evidence["steps"])
    assert finding.step == 100  # the fourth stall makes the period clear
    assert 290 <= finding.evidence["stall_ms"] <= 400
    assert finding.evidence["phase"] == "data"
    assert "every 25 steps" in finding.message


def test_the_garbage_collector_is_named_when_it_runs_in_the_stalls():
    garbage = []

    def collect_every_25(step):
        if step and step % 25 == 0:
            for _ in range(300_000):  # cycles only the collector frees: a full collection is slow
                a = []
                a.append(a)
            garbage.clear()
            gc.collect()

    # five collections: a shared machine that slows the step beside one as much hides it, four still show
    found = {f.kind: f for f in run(in_memory(), 135, collect_every_25).close()}
    finding = found["step_stalls"]
    assert finding.evidence["gc_stalls"] >= 3
    assert "garbage collector" in finding.message and "gc.freeze()" in finding.message


def test_a_noted_checkpoint_is_named():
    feed = None

    def save_every_25(step):
        if step and step % 25 == 0:
            feed.recorder.note("checkpoint save")
            time.sleep(0.2)

    model = cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    feed = Feed(model, opt)
    train(model, opt, feed, in_memory(), 110, save_every_25)
    finding = {f.kind: f for f in feed.close()}["step_stalls"]
    assert finding.evidence["notes"] == {"checkpoint save": 4}
    # a shared machine may add a stall of its own (stop 42: step 35 of one run); the saves stay named
    stalls = finding.evidence["stalls"]
    assert stalls in (4, 5) and f"checkpoint save ran in 4 of the {stalls} stalls" in finding.message


def test_checkpoint_saves_stay_info_with_a_stray_slow_step_among_them():
    """The saves' stalls are the price of the user's choice (info); a busy machine's one slow step among
    them does not make them a fault, other stalls that take much of the extra time do (warning)."""
    steps = np.arange(110)
    rows = np.zeros((len(steps), len(COLUMNS)))
    rows[:, PHASES.index("forward")] = 0.01
    other, forward = PHASES.index("other"), PHASES.index("forward")
    saves = [Stall(step, 0.21, 0.01, other, 0.0, (CHECKPOINT_SAVE,)) for step in (25, 50, 75, 100)]
    stray = Stall(62, 0.06, 0.01, forward, 0.0, ())
    found = step_stalls([*saves, stray], steps, rows, None)
    assert found.evidence["notes"] == {CHECKPOINT_SAVE: 4} and found.evidence["stalls"] == 5
    assert found.severity == "info"
    assert step_stalls(saves, steps, rows, None).severity == "info"
    slow = [Stall(step, 0.5, 0.01, forward, 0.0, ()) for step in (33, 88)]
    assert step_stalls([*saves, *slow], steps, rows, None).severity == "warning"


def test_a_healthy_loop_and_a_slow_start_are_silent():
    assert run(in_memory(), 150).close() == []

    def slow_start(step):  # compilation, a cold cache: the first steps are slow
        if step < 8:
            time.sleep(0.2)

    assert run(in_memory(), 100, slow_start).close() == []


def test_period_reads_the_common_gap():
    assert period([25, 50, 75, 100]) == 25
    assert period([25, 50, 76, 100, 125]) == 25  # within a step
    assert period([10, 50, 60, 130]) is None
    assert period([25, 50]) is None  # two gaps are not yet a period
    rng = np.random.default_rng(0)
    assert period(sorted(rng.choice(1000, 8, replace=False).tolist())) is None


def test_a_stall_beside_a_much_shorter_one_still_counts():
    """A slow spell of the machine (steps alike in a row) is left out; a 0.3 s stall whose neighbour a
    busy machine slowed by 30 ms stays (dropped with it, such a hiccup can cost a run its fourth periodic
    stall, and the finding)."""
    forward = PHASES.index("forward")

    def stall(step, seconds):
        return Stall(step, seconds, 0.003, forward, 0.0, ())

    spell = [stall(40, 0.05), stall(41, 0.06), stall(42, 0.04)]
    assert isolated(spell) == []
    save, hiccup = stall(24, 0.3), stall(25, 0.033)
    assert isolated([save, hiccup, *spell]) == [save]


def test_a_busy_machines_short_hiccups_leave_the_period():
    """A 0.3 s stall every 25 steps with two 30 ms hiccups of a busy machine between them (a fresh
    clone's full suite here: 6 stalls, the period lost) is still every 25 steps; stalls alike at irregular
    steps, or hiccups that are most of the stalls, make no period."""
    steps = np.arange(110)
    rows = np.zeros((len(steps), len(COLUMNS)))
    forward = PHASES.index("forward")
    rows[:, forward] = 0.006

    def stall(step, seconds):
        return Stall(step, seconds, 0.006, forward, 0.0, ())

    beat = [stall(step, 0.3) for step in (25, 50, 75, 100)]
    hiccups = [stall(37, 0.036), stall(88, 0.04)]
    stalls = sorted([*beat, *hiccups], key=lambda s: s.step)
    assert period([s.step for s in stalls]) is None  # the gaps 12, 13, 25, 13, 12: no common one
    assert carrying(stalls) == [25, 50, 75, 100]
    found = step_stalls(stalls, steps, rows, None)
    assert found.evidence["period"] == 25 and found.evidence["stalls"] == 6
    assert "every 25 steps (steps 25, 37, 50, 75, 88, 100)" in found.message
    assert "2 of them, far shorter, fall between the beats: a busy machine's hiccups." in found.message
    irregular = [stall(step, 0.3) for step in (12, 31, 47, 80, 93)]
    assert step_stalls([*irregular, *hiccups], steps, rows, None).evidence["period"] is None
    many = [stall(step, 0.036) for step in (5, 17, 40, 63, 70, 94)]
    assert sorted(carrying([*many, beat[0]])) == [5, 17, 25, 40, 63, 70, 94]
