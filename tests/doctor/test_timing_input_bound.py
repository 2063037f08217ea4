"""input_bound: a real slow Dataset makes the loop wait for its batches; the finding says the share and
the loader's actual settings. A loop on an in-memory loader, with or without workers, is silent."""

import os

import numpy as np
import pytest
from timing_loops import SlowImages, in_memory, run
from torch.utils.data import DataLoader

from hookscope.doctor.timing.input_bound import input_bound
from hookscope.doctor.timing.loader_settings import LoaderSettings, usable_cores
from hookscope.doctor.timing.phases import COLUMNS, DATA, OTHER

pytestmark = pytest.mark.serial  # they measure time: run alone (`make test`'s second part)


def test_a_slow_dataset_is_input_bound_with_the_share_and_the_loaders_settings():
    loader = DataLoader(SlowImages(delay=0.02 / 32), batch_size=32)  # ~20 ms per batch, ~3 ms per step
    feed = run(loader, 40, loader=loader)
    found = {f.kind: f for f in feed.close()}
    assert set(found) == {"input_bound"}
    finding = found["input_bound"]
    assert 0.6 <= finding.evidence["share"] <= 1.0
    assert f"{finding.evidence['share']:.0%}" in finding.message
    assert finding.evidence["data_ms"] >= 15
    for setting in ("num_workers=0", "pin_memory=False", "persistent_workers=False"):
        assert setting in finding.message
    assert f"{usable_cores()} cores" in finding.message
    assert finding.step == 10 + 20 - 1  # clear after the warm-up, once 20 steps were judged


def test_without_the_loader_the_finding_asks_for_it():
    loader = DataLoader(SlowImages(delay=0.02 / 32), batch_size=32)
    found = run(loader, 40).close()
    assert [f.kind for f in found] == ["input_bound"]
    assert "watch_loader" in found[0].message
    assert found[0].evidence["loader"] is None


def test_an_in_memory_loader_is_silent():
    loader = in_memory()
    feed = run(loader, 80, loader=loader)
    assert feed.close() == []
    breakdown = feed.recorder.breakdown
    assert breakdown["forward"] > 0 and breakdown["backward"] > 0 and breakdown["optimizer"] > 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="worker start-up by fork keeps this test short")
def test_a_loader_with_workers_is_silent():
    # batches of 128: the workers prepare the next batch while the model trains on this one
    loader = in_memory(batch_size=128, num_workers=2, persistent_workers=True)
    assert run(loader, 60, loader=loader).close() == []


def test_the_advice_follows_the_settings():
    single = LoaderSettings(num_workers=0, pin_memory=False, persistent_workers=False, prefetch_factor=None)
    tips = " ".join(single.advice(cores=8, cuda=True))
    assert "num_workers=7" in tips and "pin_memory=True" in tips and "persistent_workers" not in tips
    workers = LoaderSettings(num_workers=7, pin_memory=True, persistent_workers=False, prefetch_factor=2)
    tips = " ".join(workers.advice(cores=8, cuda=True))
    assert "already use" in tips and "persistent_workers=True" in tips and "prefetch_factor=2" in tips
    assert "pin_memory" not in tips
    loader = DataLoader(list(range(10)), num_workers=1, prefetch_factor=4, persistent_workers=True)
    assert LoaderSettings.of(loader) == LoaderSettings(1, False, True, 4)
    assert LoaderSettings.of(object()) is None


def test_the_message_gives_the_share_the_evidence_holds_even_on_a_rounding_edge():
    rows = np.zeros((30, len(COLUMNS)))
    rows[:, DATA], rows[:, OTHER] = 0.87496, 0.12504  # a median share of 87.496%: 87% or 88%
    finding = input_bound(np.arange(10, 40), rows, None, cores=2, cuda=False)
    assert finding.evidence["share"] == 0.875
    assert "takes 88% of each training step" in finding.message
