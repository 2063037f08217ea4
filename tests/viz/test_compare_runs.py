"""hs.compare_runs: two run folders side by side — config, curves, per-layer statistics, findings — and where
they part beyond noise."""

import json
import re
import shutil

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hookscope as hs
from hookscope.staged_folder import RunFolderError
from hookscope.viz.run_diff import NOISE_MULTIPLE, Series, _parting, noise


def fit(path, lr=1e-2, seed=0, checkpoints=True, epochs=3):
    """A small CNN with the doctor on, three epochs of five batches, written to the run folder ``path``."""
    data = torch.Generator().manual_seed(0)
    x, y = torch.randn(48, 1, 6, 6, generator=data), torch.randint(0, 3, (48,), generator=data)
    train = DataLoader(TensorDataset(x[:40], y[:40]), batch_size=8, shuffle=True)
    valid = DataLoader(TensorDataset(x[40:], y[40:]), batch_size=8)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(144, 3))
    folder = hs.callbacks.RunFolder(path, checkpoints=checkpoints, figures=False)
    cbs = [hs.callbacks.Doctor(quiet=True), folder]
    hs.Learner(model, (train, valid), nn.CrossEntropyLoss(), lr=lr, cbs=cbs, progress=False).fit(epochs)
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return {
        "a": fit(root / "a"),
        "again": fit(root / "again"),  # the same seed and options: a rerun
        "faster": fit(root / "faster", lr=5e-2),  # the same seed and start, another learning rate
    }


def test_a_rerun_with_the_same_seed_is_identical(runs, tmp_path):
    result = hs.compare_runs(runs["a"], runs["again"], out=tmp_path)
    assert result.identical and result.first is None and result.config_diff == []
    # activation mean and std of 3 layers (conv, relu, linear); gradient norm and update ratio of 2
    assert result.compared_series == 3 * 2 + 2 * 2
    assert "are identical" in str(result)
    page = (tmp_path / "compare.html").read_text()
    assert result.page == tmp_path / "compare.html"
    assert "are identical" in page and "No per-layer statistic parts beyond its noise." in page


def test_another_learning_rate_parts_after_the_first_step_and_is_named(runs, tmp_path):
    result = hs.compare_runs(runs["a"], runs["faster"], out=tmp_path)
    assert not result.identical
    assert result.config_diff == [("learner.lr", 0.01, 0.05)]
    first = result.first
    # both runs start from the same weights and batch: what step 0 computes is the same, its update is not
    assert (first.kind, first.layer, first.step) == ("update ratio", "0", 0)
    assert first.b > 3 * first.a  # five times the learning rate
    assert all(p.step >= 1 for p in result.partings if p.kind == "activations")
    assert any(p.kind == "activations" for p in result.partings)
    assert abs(first.a - first.b) > NOISE_MULTIPLE * first.noise
    assert all(p.step >= first.step for p in result.partings)
    text = str(result)
    assert f"part at step {first.step}" in text and first.layer in text
    page = (tmp_path / "compare.html").read_text()
    assert f"part at step {first.step}" in page and "<h2>Configuration differences</h2>" in page
    assert page.count('src="data:image/png;base64,') == 1  # the parting series; the curves are charts
    assert page.count('<div class="hs-chart">') >= 2
    assert not re.findall(r'(?:src|href)="(?:https?:)?//', page)  # nothing fetched


def test_the_same_series_never_parts_and_noise_is_the_median_step(runs):
    assert noise(Series([0, 1, 2, 3], [1.0, 2.0, 2.5, 5.0])) == 1.0
    steady = Series([0, 1, 2, 3], [1.0, 2.0, 3.0, 4.0])  # noise 1
    close = Series([0, 1, 2, 3], [1.0, 2.0, 5.9, 4.0])  # 2.9 apart at step 2: within 3x noise
    far = Series([0, 1, 2, 3], [1.0, 2.0, 3.0, 7.5])  # 3.5 apart at step 3
    assert _parting("activations", ("x", "std"), steady, steady) is None
    assert _parting("activations", ("x", "std"), steady, close) is None
    parted = _parting("activations", ("x", "std"), steady, far)
    assert (parted.step, parted.a, parted.b, parted.noise) == (3, 4.0, 7.5, 1.0)


def test_the_layers_come_from_history_json_without_loading_a_checkpoint(runs, tmp_path):
    b = tmp_path / "faster"
    shutil.copytree(runs["faster"], b)
    (b / "checkpoints" / "last.pt").write_bytes(b"not a checkpoint")
    result = hs.compare_runs(runs["a"], b)
    assert result.b.layers_note == ""
    assert (result.first.kind, result.first.layer, result.first.step) == ("update ratio", "0", 0)
    assert result.compared_series == 10


def test_a_folder_older_than_history_json_is_read_from_its_checkpoint(runs, tmp_path):
    old = {}
    for name in ("a", "faster"):
        old[name] = tmp_path / name
        shutil.copytree(runs[name], old[name])
        (old[name] / "history.json").unlink()
    from_checkpoints = hs.compare_runs(old["a"], old["faster"])
    from_history = hs.compare_runs(runs["a"], runs["faster"])
    assert from_checkpoints.a.layers_note == from_checkpoints.b.layers_note == ""
    assert from_checkpoints.partings == from_history.partings  # the same records, in the same layout
    assert from_checkpoints.compared_series == 10


def test_a_run_without_checkpoints_compares_its_layers_from_history_json(runs, tmp_path):
    bare = fit(tmp_path / "bare", checkpoints=False, epochs=1)
    result = hs.compare_runs(runs["a"], bare, out=tmp_path)
    assert ("options.epochs", None, None) not in result.config_diff
    assert result.b.layers_note == "" and result.compared_series == 10
    assert result.first is None and not result.identical  # the same first epoch: only the metrics differ
    assert '<table id="layers">' in (tmp_path / "compare.html").read_text()


def test_an_older_run_without_checkpoints_compares_what_it_has(runs, tmp_path):
    bare = fit(tmp_path / "bare", checkpoints=False, epochs=1)
    (bare / "history.json").unlink()
    result = hs.compare_runs(runs["a"], bare, out=tmp_path)
    assert result.first is None and not result.identical
    assert "neither history.json nor a checkpoint" in result.b.layers_note
    assert "no per-layer statistics could be compared" in str(result)
    assert "No per-layer statistics to compare" in (tmp_path / "compare.html").read_text()


def test_findings_of_each_run_are_shown_and_marked_when_only_one_has_them(runs, tmp_path):
    b = tmp_path / "b"
    shutil.copytree(runs["again"], b)
    finding = {"kind": "dead_units", "module": "1", "step": 4, "severity": "warning", "message": "half dead"}
    (b / "findings.json").write_text(json.dumps([finding]))
    result = hs.compare_runs(runs["a"], b, out=tmp_path)
    page = (tmp_path / "compare.html").read_text()
    assert "<b>only here</b> half dead" in page
    assert result.b.findings == [finding]


def test_a_folder_that_is_not_a_run_is_refused(runs, tmp_path):
    with pytest.raises(RunFolderError, match="is not a hookscope run folder"):
        hs.compare_runs(runs["a"], tmp_path)
