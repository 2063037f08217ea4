"""The timing kinds through the real loops at their defaults: ``Doctor()`` in the Learner, ``hs.watch`` in a
hand-written loop and ``HookscopeCallback`` in Lightning's Trainer name ``input_bound`` (with the loader's
settings), ``step_stalls`` (with the callback or the checkpoint save that ran in them) and
``memory_growth`` (joined to ``graph_kept_alive`` when kept graphs are the cause)."""

import itertools
import time

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from timing_loops import Leak, SlowImages, cnn, collect_earlier_garbage, images, in_memory, stall_every
from torch import nn
from torch.utils.data import DataLoader

import hookscope as hs
from hookscope.callbacks import Checkpoint, Doctor
from hookscope.doctor.timing.loader_settings import usable_cores
from hookscope.doctor.timing.phases import DATA, OTHER
from hookscope.train.callback import Callback

pytestmark = pytest.mark.serial  # they measure time: run alone (`make test`'s second part)

TIMING = {"input_bound", "step_stalls", "memory_growth"}


def slow_loader(batches=40):
    """~32 ms per batch of 32 from a Dataset whose __getitem__ sleeps (a decode, a network read)."""
    torch.set_num_threads(1)
    return DataLoader(SlowImages(delay=1e-3, n=32 * batches), batch_size=32)


def kinds(findings):
    return {f.kind: f for f in findings if f.kind in TIMING}


def learner(loader, *cbs, model=None):
    torch.set_num_threads(1)
    doctor = Doctor(quiet=True)
    model = model if model is not None else cnn()
    return hs.Learner(model, (loader, None), nn.CrossEntropyLoss(), cbs=[doctor, *cbs], progress=False)


def assert_names_the_loader(finding):
    assert finding.evidence["share"] >= 0.5
    for setting in ("num_workers=0", "pin_memory=False", "persistent_workers=False"):
        assert setting in finding.message
    assert f"{usable_cores()} cores" in finding.message


def assert_periodic(stalls, steps):
    """Every 25 steps, at ``steps`` (a busy machine may add a slow step of its own between them)."""
    assert stalls.evidence["period"] == 25 and set(steps) <= set(stalls.evidence["steps"])


# ---- the Learner -----------------------------------------------------------------------------------


def test_the_learner_names_a_slow_dataset_with_its_loaders_settings():
    learn = learner(slow_loader())
    learn.fit(1)
    found = kinds(learn.doctor.findings)
    assert set(found) == {"input_bound"}
    assert_names_the_loader(found["input_bound"])


class SlowEvery(Callback):
    """A callback whose ``after_batch`` takes ``seconds`` every ``period`` steps (a tracker drawing a
    figure, a metric over the whole validation set)."""

    def __init__(self, period, seconds):
        self.period, self.seconds = period, seconds

    def after_batch(self):
        if self.learn.training and self.learn.training_step % self.period == 0:
            time.sleep(self.seconds)


def assert_names_slow_every(stalls):
    """Four or five of the stalls at steps 24, 49, ..., 124 (a shared machine may hide one, slowing the step
    beside it as much), every one of them SlowEvery's."""
    named = set(stalls.evidence["steps"]) & {24, 49, 74, 99, 124}
    assert len(named) >= 4 and stalls.evidence["period"] == 25
    of = f"{len(named)} of the {stalls.evidence['stalls']} stalls"
    assert f"SlowEvery.after_batch took most of the extra time in {of}" in stalls.message


def test_the_learner_names_the_callback_that_ran_in_the_stalls():
    learn = learner(in_memory(), SlowEvery(25, 0.3))
    learn.fit(9)  # 144 steps
    found = kinds(learn.doctor.findings)
    assert set(found) == {"step_stalls"}
    assert_names_slow_every(found["step_stalls"])


class WithTable(nn.Module):
    """The CNN with a 256 MB lookup table of bytes it carries as a buffer: each checkpoint writes it (a
    fast disk writes it in ~0.1 s, a stall; no guard snapshots it, being no float)."""

    def __init__(self):
        super().__init__()
        self.net = cnn()
        self.register_buffer("table", torch.zeros(256_000_000, dtype=torch.uint8))

    def forward(self, x):
        return self.net(x)


def test_the_learner_names_the_checkpoint_saves_in_the_stalls(tmp_path):
    save = Checkpoint(tmp_path, every_n_steps=25, every_epoch=False, keep_last=1)
    learn = learner(in_memory(), save, model=WithTable())
    learn.fit(7)
    found = kinds(learn.doctor.findings)
    timing = learn.doctor.engine.timing
    assert set(found) == {"step_stalls"}, [(s.step, s.seconds, s.usual) for s in timing.stalls.stalls]
    stalls = found["step_stalls"]
    assert_periodic(stalls, [25, 50, 75, 100])
    assert stalls.evidence["notes"]["checkpoint save"] == 4 and stalls.severity == "info"
    assert "A checkpoint save ran in 4 of the" in stalls.message
    # the save runs between two steps, in a callback: the loop's own work, not a wait for the loader
    assert stalls.evidence["phase"] == "other"


class SnapshotsEveryStep(Callback):
    """Copies a 32 MB state before every batch (a guard keeping what it would roll back to): the callbacks'
    time between two steps, which the loader has no part in."""

    def __init__(self):
        self.state, self.copy = torch.ones(8_000_000), torch.empty(8_000_000)

    def before_batch(self):
        self.copy.copy_(self.state)
        self.copy.add_(1.0)


def test_the_callbacks_between_two_steps_are_not_a_wait_for_data():
    learn = learner(in_memory(), SnapshotsEveryStep())
    learn.fit(4)
    assert "input_bound" not in kinds(learn.doctor.findings)
    _, rows = learn.doctor.engine.timing.recent.view()
    data, other = np.median(rows[:, DATA]), np.median(rows[:, OTHER])
    assert other > 2 * data  # the copy is timed where it ran


class TracksPredictions(Callback):
    """Keeps the model's predictions on a fixed batch after every step, to plot them later — computed
    without ``torch.no_grad()``: each keeps its graph, whose saved activations no backward frees."""

    def __init__(self):
        self.x = images(64)[0]
        self.kept = []

    def after_batch(self):
        if self.learn.training:
            self.kept.append(self.learn.model(self.x).softmax(1))


def test_the_learner_joins_memory_growth_to_the_graphs_kept_alive():
    learn = learner(in_memory(), TracksPredictions())
    collect_earlier_garbage()
    learn.fit(6)  # 96 steps: ~1 MB of saved activations each
    by_kind = {f.kind: f for f in learn.doctor.findings}
    assert {"graph_kept_alive", "memory_growth"} <= set(by_kind)
    assert ("memory_growth", "") in by_kind["graph_kept_alive"].explains
    assert by_kind["memory_growth"].evidence["bytes_per_step"] > 100_000
    assert not {"input_bound", "step_stalls"} & set(by_kind)


def test_the_doctors_checkpoint_carries_the_timing_and_a_resumed_fit_goes_on(tmp_path):
    learn = learner(in_memory(), SlowEvery(25, 0.3))
    learn.fit(4)  # 64 steps: two stalls
    assert "step_stalls" not in kinds(learn.doctor.findings)
    learn.save(tmp_path / "ckpt.pt")
    resumed = learner(in_memory(), SlowEvery(25, 0.3))
    resumed.fit(7, resume=tmp_path / "ckpt.pt")
    timing = resumed.doctor.engine.timing
    assert timing.steps_read == 112 and timing.stalls.count >= 4
    stalls = kinds(resumed.doctor.findings)["step_stalls"]
    assert_periodic(stalls, [24, 49, 74, 99])


# ---- hs.watch ----------------------------------------------------------------------------------------


def watched_loop(data, steps, before_step=None, **options):
    """The textbook loop under ``hs.watch(model, opt, ...)``; ``before_step(w, i)`` runs before each
    step's forward."""
    torch.set_num_threads(1)
    model = cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    batches = itertools.islice(itertools.cycle(data), steps)
    with hs.watch(model, opt, quiet=True, **options) as w:
        for i, (x, y) in enumerate(batches):
            if before_step is not None:
                before_step(w, i)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            w.log(loss, target=y)
            loss.backward()
            opt.step()
    return w.findings


def test_hs_watch_names_a_slow_dataset_with_the_loader_it_was_given():
    loader = slow_loader()
    found = kinds(watched_loop(loader, 40, loader=loader))
    assert set(found) == {"input_bound"}
    assert_names_the_loader(found["input_bound"])


def test_hs_watch_names_what_the_loop_noted_in_its_stalls(tmp_path):
    table = torch.zeros(48_000_000)  # 192 MB: 135 ms or more a save here; 64 MB took 25 ms at times, no stall

    def save_every_25(w, i):
        if i and i % 25 == 0:
            w.note("checkpoint save")
            torch.save({"table": table}, tmp_path / "ckpt.pt")

    stalls = kinds(watched_loop(in_memory(), 110, save_every_25))["step_stalls"]
    assert_periodic(stalls, [25, 50, 75, 100])
    assert "A checkpoint save ran in 4 of the" in stalls.message


def test_hs_watch_names_a_leak_with_its_rate_and_nothing_else():
    leak = Leak(mb=1.0)
    collect_earlier_garbage()
    leak.back(100)
    found = kinds(watched_loop(in_memory(), 100, lambda w, i: leak(i)))
    assert set(found) == {"memory_growth"}
    assert 0.7 * (1 << 20) <= found["memory_growth"].evidence["bytes_per_step"] <= 1.5 * (1 << 20)


def test_hs_watch_joins_memory_growth_to_the_predictions_kept_with_their_graphs():
    x, kept = images(64)[0], []
    collect_earlier_garbage()
    found = {f.kind: f for f in watched_loop(in_memory(), 100, lambda w, i: kept.append(w.model(x)))}
    assert ("memory_growth", "") in found["graph_kept_alive"].explains


# ---- Lightning ---------------------------------------------------------------------------------------


class Lit(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = cnn()

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def lightning_fit(loader, callbacks, steps):
    trainer = pl.Trainer(
        callbacks=callbacks,
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(Lit(), loader)


def test_lightning_names_a_slow_dataset_with_the_trainers_loader():
    from hookscope.integrations.lightning import HookscopeCallback

    callback = HookscopeCallback(quiet=True)
    lightning_fit(slow_loader(), [callback], 40)
    found = kinds(callback.findings)
    assert set(found) == {"input_bound"}
    assert_names_the_loader(found["input_bound"])


def test_lightning_names_a_periodic_stall():
    from hookscope.integrations.lightning import HookscopeCallback

    class Stalls(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            stall_every(25, 0.3)(trainer.global_step)

    callback = HookscopeCallback(quiet=True)
    lightning_fit(in_memory(), [Stalls(), callback], 110)
    assert_periodic(kinds(callback.findings)["step_stalls"], [25, 50, 75, 100])


def test_timing_the_callbacks_keeps_the_training_loop_readable(capsys):
    learner(in_memory(), SlowEvery(25, 0.3)).show_training_loop()
    lines = capsys.readouterr().out.splitlines()
    after_batch = next(line for line in lines if line.strip().startswith("after_batch"))
    assert "SlowEvery" in after_batch and "Doctor" in after_batch


def test_the_callbacks_are_timed_under_callback_costs_timer_too():
    cost = hs.callbacks.CallbackCost()
    learn = learner(in_memory(), cost, SlowEvery(25, 0.3))
    learn.fit(9)
    assert_names_slow_every(kinds(learn.doctor.findings)["step_stalls"])
    assert cost.costs["slow_every"]["after_batch"]["calls"] == 144


class StepsRead(Callback):
    """After the Doctor's ``after_batch``: how many steps' times had reached the host by then."""

    order = 20

    def __init__(self):
        self.seen = []

    def after_batch(self):
        if self.learn.training:
            self.seen.append(self.learn.doctor.timing.steps_read)


def test_the_times_are_read_at_the_doctors_checks_only_when_the_timing_rules_are_due():
    seen = StepsRead()
    # 80 steps, checks at the end of steps 4 (the warm-up's), 24, 44 and 64; the timing's rules at the first
    # check and then at the first with 50 new steps
    learner(in_memory(), seen).fit(5)
    assert seen.seen == [0] * 4 + [5] * 60 + [65] * 16


class SlowWhenEager(nn.Module):
    """The CNN, 0.1 s slower when it runs eagerly: its compiled graph leaves the sleep out (dynamo folds
    the branch), so only the steps the doctor records — run eagerly, hooks and all — are slow."""

    def __init__(self):
        super().__init__()
        self.net = cnn()

    def forward(self, x):
        if not torch.compiler.is_compiling():
            time.sleep(0.1)
        return self.net(x)


def test_the_eager_steps_a_compiled_model_is_recorded_in_are_no_stalls():
    torch.set_num_threads(1)
    model = torch.compile(SlowWhenEager(), backend="eager")
    learn = hs.Learner(
        model, (in_memory(), None), nn.CrossEntropyLoss(), cbs=[Doctor(quiet=True)], progress=False
    )
    learn.fit(13)  # 208 steps: recorded (eager) at 0-4, 50, 100, 150 and 200
    timing = learn.doctor.engine.timing
    noted = {s.step for s in timing.stalls.stalls if "a recorded step, run eagerly" in s.notes}
    assert {50, 100, 150, 200} <= noted  # seen as slow, and known for the doctor's own
    assert "step_stalls" not in kinds(learn.doctor.findings)
