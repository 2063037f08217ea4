"""TensorBoardCallback, read back through TensorBoard's own event accumulator: the values are the run's."""

import numpy as np
import pytest
import torch
from trackers_support import faulty_learner, tensorboard, tensorboard_texts

import hookscope as hs
from hookscope.callbacks.trackers import TrackerWarning

pytestmark = pytest.mark.usefixtures("deterministic")


def test_losses_statistics_and_findings_are_the_runs(tmp_path):
    tb = hs.callbacks.TensorBoardCallback(tmp_path / "tb", every=1, stats_every=1, hist_every=5)
    learn = faulty_learner(tb)
    learn.fit(2)
    events = tensorboard(tmp_path / "tb")

    losses = events.Scalars("train/loss")
    assert [e.step for e in losses] == list(range(len(learn.recorder.losses)))
    assert [e.value for e in losses] == pytest.approx(learn.recorder.losses, rel=1e-7)
    assert [e.value for e in events.Scalars("train/lr")] == pytest.approx(learn.recorder.lrs)
    valid = [row["valid_loss"] for row in learn.recorder.history]
    assert [e.value for e in events.Scalars("epoch/valid_loss")] == pytest.approx(valid)

    # one histogram every 5 steps per watched layer, with the device-counted bins of the statistics
    history = learn.doctor.activations.history["1"]
    logged = events.Histograms("activations/1")
    assert [h.step for h in logged] == list(range(0, len(learn.recorder.losses), 5))
    for event in logged:
        (record,) = [r for r in history if r.step == event.step]
        assert event.histogram_value.bucket == record.stats.histogram.tolist()
        assert event.histogram_value.bucket_limit == pytest.approx(record.stats.edges[1:].tolist())
    assert events.Histograms("gradients/3")  # output gradients of the last layer, too

    (finding,) = [f for f in learn.doctor.findings if f.kind == "dead_units"]
    ((step, text),) = tensorboard_texts(events, "doctor/dead_units")
    assert step == finding.step == 6
    assert "`2`" in text and finding.message in text

    # per-layer scalars grouped by statistic: dead units of the ReLU read 1.0 once it died
    dead = {e.step: e.value for e in events.Scalars("dead_units/2")}
    assert dead[3] == 0.0 and dead[10] == 1.0
    assert {e.step for e in events.Scalars("grad_norm/1")} == {e.step for e in losses}


def test_config_summary_and_predictions(tmp_path):
    tb = hs.callbacks.TensorBoardCallback(tmp_path / "tb", log_dataset=True, log_model=True)
    learn = faulty_learner(tb)
    learn.fit(1)
    events = tensorboard(tmp_path / "tb")
    ((_, summary),) = tensorboard_texts(events, "model/summary")
    assert "Linear" in summary and "2,410" in summary  # 64*32+32 + 32*10+10 parameters
    ((_, dataset),) = tensorboard_texts(events, "dataset")
    assert "| train_samples | 1438 |" in dataset and "| valid_samples | 359 |" in dataset  # 1797 digits
    assert "| input_shape | [1, 8, 8] |" in dataset and "| classes | 10 |" in dataset
    (images,) = events.Images("predictions/inputs")
    assert images.step == learn.training_step - 1
    ((_, table),) = tensorboard_texts(events, "predictions")
    assert table.count("\n") == 16 + 1  # header, separator, 16 rows

    from safetensors.torch import load_file

    saved = load_file(tmp_path / "tb" / "model.safetensors")
    assert torch.equal(saved["3.weight"], learn.model[3].weight)


def test_resumed_fit_continues_the_steps_without_overlap(tmp_path):
    """A crash 7 steps after the checkpoint of step 30: the resumed run's steps pick up at 30, the 7 steps
    the crashed run logged after its checkpoint are dropped, nothing repeats."""

    class Crash(hs.Callback):
        order = 95  # after the Checkpoint

        def after_step(self):
            if self.learn.training_step == 37:
                raise RuntimeError("power cut")

    def make(*cbs):
        ckpt = hs.callbacks.Checkpoint(tmp_path / "ckpt", every_n_steps=10)
        return faulty_learner(ckpt, hs.callbacks.TensorBoardCallback(tmp_path / "tb", every=1), *cbs)

    with pytest.raises(RuntimeError, match="power cut"):
        make(Crash()).fit(2)
    learn = make()
    learn.fit(2, resume=tmp_path / "ckpt")
    losses = tensorboard(tmp_path / "tb").Scalars("train/loss")
    assert [e.step for e in losses] == list(range(2 * 23))
    assert [e.value for e in losses] == pytest.approx(learn.recorder.losses, rel=1e-7)


def test_unwritable_log_dir_warns_once_and_the_run_folder_is_written(tmp_path):
    (tmp_path / "a-file").write_text("not a folder")
    tb = hs.callbacks.TensorBoardCallback(tmp_path / "a-file" / "tb")
    learn = faulty_learner(tb, hs.callbacks.RunFolder(tmp_path / "run", figures=False))
    with pytest.warns(TrackerWarning) as caught:
        learn.fit(2)
    (warning,) = [w for w in caught if w.category is TrackerWarning]
    assert "TensorBoardCallback: starting failed" in str(warning.message) and "a-file" in str(warning.message)
    assert len(learn.recorder.history) == 2
    assert (tmp_path / "run" / "report.html").is_file() and (tmp_path / "run" / "metrics.csv").is_file()
    assert tb.failure is not None and np.isfinite(learn.recorder.history[-1]["valid_loss"])
