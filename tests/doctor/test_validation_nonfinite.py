"""NaN/Inf on the validation data is a finding like any other: kept in learn.doctor.findings, naming the
first layer that output it (or the validation loss), and listed by `hookscope train` instead of
"no problem found"."""

import json
import math

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hookscope as hs
from hookscope.callbacks import Doctor, RunFolder
from hookscope.cli.train import closing_words
from hookscope.doctor.record_types import StepStats
from hookscope.doctor.rules import nonfinite_validation
from hookscope.hooks.stats import RunningStats


def _images(nan_in="none"):
    """Random 8x8 images (6 training batches, 2 validation batches) with one NaN pixel or target."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 1, 8, 8, generator=g), torch.randint(0, 3, (64,), generator=g)
    valid_x, valid_y = x[48:].clone(), y[48:].float()
    if nan_in == "pixel":
        valid_x[11, 0, 3, 4] = math.nan
    if nan_in == "target":
        valid_y[2] = math.nan
    train = DataLoader(TensorDataset(x[:48], y[:48].float()), batch_size=8, shuffle=True, generator=g)
    return train, DataLoader(TensorDataset(valid_x, valid_y), batch_size=8)


def _learner(nan_in, cbs):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 64, 1))
    loss = nn.MSELoss()

    def mse(pred, target):
        return loss(pred.squeeze(1), target)

    return hs.Learner(model, _images(nan_in), mse, lr=1e-2, cbs=cbs, progress=False)


def _validation_findings(learn):
    return [f for f in learn.doctor.findings if f.kind == "nonfinite_validation"]


def test_a_nan_pixel_in_validation_is_an_error_naming_the_first_layer():
    learn = _learner("pixel", [Doctor(quiet=True)])
    learn.fit(2)
    assert all(math.isnan(row["valid_loss"]) for row in learn.recorder.history)
    (finding,) = _validation_findings(learn)  # once per run, though both epochs saw it
    assert (finding.module, finding.severity, finding.step) == ("0", "error", 6)
    assert finding.message.startswith(
        "validation at step 6: layer `0` was the first to output NaN/Inf (36 values); it is the first "
        "watched layer, so the validation inputs likely hold NaN/Inf. valid_loss is then NaN/Inf"
    )
    assert finding.evidence["loss_nonfinite_batches"] == 1 and finding.evidence["batches"] == 2


def test_a_nan_validation_loss_with_finite_outputs_blames_the_validation_loss():
    learn = _learner("target", [Doctor(quiet=True)])
    learn.fit(1)
    (finding,) = _validation_findings(learn)
    assert (finding.module, finding.severity) == ("", "error")
    assert finding.message.startswith(
        "validation at step 6: the validation loss was NaN/Inf in 1 of 2 batch(es)."
    )


def test_clean_validation_data_gives_no_such_finding():
    learn = _learner("none", [Doctor(quiet=True)])
    learn.fit(1)
    assert _validation_findings(learn) == []


def test_the_run_folder_and_the_cli_list_it_instead_of_no_problem_found(tmp_path):
    out = tmp_path / "run"
    learn = _learner("pixel", [Doctor(quiet=True), RunFolder(out, figures=False)])
    learn.fit(1)
    saved = json.loads((out / "findings.json").read_text())
    assert [(f["kind"], f["module"], f["severity"]) for f in saved] == [
        ("nonfinite_validation", "0", "error")
    ]
    learn.recorder.history[-1]["accuracy"] = math.nan  # closing_words prints it; this model has no metric
    words = closing_words(learn, out, 1.0, learn.doctor.findings)
    assert "doctor: no problem found" not in words
    assert (
        "top findings:\n  [error] 0: validation at step 6: layer `0` was the first to output NaN/Inf" in words
    )


def _record(step, tensor):
    stats = RunningStats()
    stats.update(tensor)
    return StepStats(step, stats.read())


def test_the_rule_takes_the_earliest_phase_and_the_first_layer_in_model_order():
    finite, poisoned = torch.ones(2, 3), torch.tensor([[1.0, math.inf, 1.0], [1.0, 1.0, 1.0]])
    layers = {
        "a": [_record(5, finite), _record(10, finite)],
        "b": [_record(5, finite), _record(10, poisoned)],
        "c": [_record(5, poisoned), _record(10, poisoned)],
    }
    (finding,) = nonfinite_validation([(5, 3, 0), (10, 3, 3)], layers)
    assert (finding.module, finding.step) == ("c", 5)
    assert finding.evidence == {"nonfinite_values": {"c": 1}, "loss_nonfinite_batches": 0, "batches": 3}
    assert nonfinite_validation([(5, 3, 0)], {"a": [_record(5, finite)]}) == []


class _StopAtStep(hs.Callback):
    """Raises after the given optimizer step: a crash right after the epoch's checkpoint was written."""

    def __init__(self, step):
        self.step = step

    def after_step(self):
        if self.learn.training_step == self.step:
            raise RuntimeError("stopped")


def test_a_nan_validation_loss_seen_before_a_checkpoint_is_reported_after_the_resume(tmp_path):
    """A NaN target: the outputs are finite, so only the Doctor's own record of the phase holds it."""
    checkpoint = {"every_epoch": True, "sigint": False}
    crashed = _learner(
        "target", [Doctor(quiet=True, check_every=100), hs.callbacks.Checkpoint(tmp_path, **checkpoint)]
    )
    with pytest.raises(RuntimeError, match="stopped"):
        crashed.fit(2, cbs=[_StopAtStep(7)])  # epoch 0 validated (NaN), checkpoint written, then a crash
    assert _validation_findings(crashed) == []  # the Doctor had not checked yet when it stopped

    learn = _learner(
        "target", [Doctor(quiet=True, check_every=100), hs.callbacks.Checkpoint(tmp_path, **checkpoint)]
    )
    learn.fit(2, resume=tmp_path)
    assert [f.step for f in _validation_findings(learn)] == [6]  # dated from the first part's validation
