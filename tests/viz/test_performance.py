"""The timing of a real fit leaves the doctor in three places: ``timing.json`` in the run folder, ``time/*``
scalars in TensorBoard (read back from the event files) and the Performance section of report.html, opened
in headless Chromium (its figure decodes, its cards name the phases)."""

import json
import re
import time

import pytest
import torch
from test_report import PROBE, chromium
from torch import nn
from torch.utils.data import DataLoader, Dataset

import hookscope as hs

PHASES = ["data", "forward", "backward", "optimizer", "other"]


class SlowDigits(Dataset):
    """Random 1x16x16 images whose ``__getitem__`` sleeps 0.2 ms (a decode): data shows in the breakdown."""

    def __init__(self, n=32 * 30):
        gen = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 1, 16, 16, generator=gen), torch.randint(0, 10, (n,), generator=gen)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        time.sleep(2e-4)
        return self.x[i], self.y[i]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Two epochs of 30 steps with the Doctor, a RunFolder and TensorBoard; the folder and the Learner."""
    out = tmp_path_factory.mktemp("performance")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 256, 10))
    cbs = [
        hs.callbacks.Doctor(quiet=True),
        hs.callbacks.RunFolder(out / "run"),
        hs.callbacks.TensorBoardCallback(out / "tb", stats_every=5, read_every=20),
    ]
    learn = hs.Learner(model, (DataLoader(SlowDigits(), batch_size=32), None), nn.CrossEntropyLoss(), cbs=cbs)
    learn.fit(2)
    return out, learn


def test_timing_json_holds_the_breakdown_the_run_and_memory(run):
    out, learn = run
    timing = json.loads((out / "run" / "timing.json").read_text())
    recorder = learn.doctor.timing
    assert timing["step_phases"] == PHASES and timing["steps_timed"] == 60
    assert timing["breakdown_s"]["data"] >= 32 * 2e-4  # every batch sleeps this long
    assert timing["breakdown_s"] == pytest.approx(recorder.breakdown, abs=1e-6)
    assert timing["run"]["first_steps"] == list(range(60)) and len(timing["run"]["seconds"]) == 60
    assert timing["recent"]["steps"] == list(range(10, 60))  # after the warm-up
    assert timing["memory"]["what"] == "the process's resident memory in use"
    assert timing["memory"]["first_steps"] == list(range(0, 60, 4)) and min(timing["memory"]["bytes"]) > 0


def test_tensorboard_gets_the_time_of_each_phase_per_step(run):
    from tensorboard.backend.event_processing import event_accumulator as ea

    out, learn = run
    events = next((out / "tb").rglob("events.out.tfevents.*")).parent
    scalars = ea.EventAccumulator(str(events), size_guidance={ea.SCALARS: 0})
    scalars.Reload()
    steps = [event.step for event in scalars.Scalars("time/step")]
    assert steps == list(range(10, 60, 5))  # the timed steps after the warm-up, stats_every apart
    _, rows = learn.doctor.timing.recent.view()
    for i, phase in enumerate(PHASES):
        logged = [event.value for event in scalars.Scalars(f"time/{phase}")]
        assert logged == pytest.approx(rows[::5, i].tolist(), rel=1e-5)


@pytest.mark.browser
def test_the_report_shows_the_performance_section(run, tmp_path):
    out, _ = run
    page = (out / "run" / "report.html").read_text()
    section = re.search(r"<section><h2>Performance</h2>.*?</section>", page, re.S).group(0)
    for phase in PHASES:
        assert re.search(rf'<div class="k">{phase} · \d+%</div><div class="v">[\d.]+ (ms|µs)</div>', section)
    probed = tmp_path / "probed.html"
    probed.write_text(page.replace("<head>", "<head>\n" + PROBE, 1))
    done = chromium(tmp_path, "--virtual-time-budget=10000", "--dump-dom", probed.as_uri())
    probe = json.loads(re.search(r'<pre id="probe">(.*?)</pre>', done.stdout, re.S).group(1))
    assert probe["errors"] == []
    drawn = [i for i in probe["images"] if i["alt"].startswith("Time per step in each phase")]
    assert len(drawn) == 1 and drawn[0]["width"] == 1400
