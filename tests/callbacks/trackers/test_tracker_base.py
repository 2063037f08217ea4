"""What every tracker shares (shown through TensorBoard, the cheapest to read back): the bounded rates,
gradients logged unscaled under mixed precision, and a tracker that fails mid-run never stops training."""

import pytest
import torch
from torch import nn
from trackers_support import faulty_learner, tensorboard

import hookscope as hs
from hookscope.callbacks.trackers import TrackerWarning
from hookscope.callbacks.trackers.records import module_gradients, since, spaced
from hookscope.data.digits import digits_loaders

pytestmark = pytest.mark.usefixtures("deterministic")


def test_spaced_steps_keep_the_spacing_across_reads():
    assert spaced([0, 1, 2, 3, 4, 5, 6], last=None, spacing=3) == [0, 3, 6]
    assert spaced([7, 8, 9, 10], last=6, spacing=3) == [9]
    assert spaced([5, 5, 2], last=None, spacing=1) == [2, 5]


def test_since_returns_the_records_after_a_step():
    records = [hs.callbacks.ParamRecord(step, 1.0, None) for step in (0, 2, 4, 6)]
    assert [r.step for r in since(records, 2)] == [4, 6]
    assert since(records, None) == records and since(records, 6) == []


def test_module_gradients_sum_parameters_per_module():
    records = {
        "conv.weight": hs.callbacks.ParamRecord(0, 3.0, 1e-3),
        "conv.bias": hs.callbacks.ParamRecord(0, 4.0, 5e-2),
        "frozen.weight": hs.callbacks.ParamRecord(0, None, None),
    }
    assert module_gradients(records) == {"grad_norm/conv": 5.0, "update_ratio/conv": 1e-3}


def test_default_rates_bound_what_is_logged(tmp_path):
    learn = faulty_learner(hs.callbacks.TensorBoardCallback(tmp_path / "tb"))
    learn.fit(2)  # 46 steps; the doctor records statistics at every step
    events = tensorboard(tmp_path / "tb")
    assert [e.step for e in events.Scalars("train/loss")] == [0, 10, 20, 30, 40]
    assert [e.step for e in events.Scalars("activation_std/1")] == [0]  # stats_every=50
    assert [h.step for h in events.Histograms("activations/1")] == [0]  # hist_every=100


def test_gradients_are_logged_unscaled_under_float16_loss_scaling(tmp_path):
    def grad_norm(*precision):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
        tb = hs.callbacks.TensorBoardCallback(tmp_path / str(len(precision)), stats_every=1)
        cbs = [hs.callbacks.GradientStats(), tb, *precision]
        learn = hs.Learner(model, digits_loaders(), nn.CrossEntropyLoss(), cbs=cbs, progress=False)
        learn.fit(1)
        (first, *_) = tensorboard(tmp_path / str(len(precision))).Scalars("grad_norm/1")
        return first.value, learn

    full, _ = grad_norm()
    scaled, learn = grad_norm(hs.callbacks.MixedPrecision(torch.float16, init_scale=2.0**16))
    assert learn.mixed_precision.scaler.get_scale() == 2.0**16  # the loss was scaled 65536x
    assert scaled == pytest.approx(full, rel=1e-3)


class FullDisk(hs.callbacks.TensorBoardCallback):
    """TensorBoard on a disk that fills up after the first write."""

    writes = 0

    def write_scalars(self, rows):
        self.writes += 1
        if self.writes > 1:
            raise OSError(28, "No space left on device")
        super().write_scalars(rows)


def test_a_tracker_failing_mid_run_warns_once_and_keeps_what_it_wrote(tmp_path):
    tracker = FullDisk(tmp_path / "tb", every=1, read_every=5)
    learn = faulty_learner(tracker, hs.callbacks.RunFolder(tmp_path / "run", figures=False))
    with pytest.warns(TrackerWarning) as caught:
        learn.fit(2)
    (warning,) = [w for w in caught if w.category is TrackerWarning]
    assert str(warning.message).startswith("FullDisk: logging failed (OSError: [Errno 28] No space left")
    assert tracker.writes == 2 and len(learn.recorder.history) == 2
    assert [e.step for e in tensorboard(tmp_path / "tb").Scalars("train/loss")] == [0, 1, 2, 3, 4]
    assert (tmp_path / "run" / "report.html").is_file()
