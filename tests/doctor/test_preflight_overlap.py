"""train_valid_overlap: validation samples that are also training samples, counted exactly on small sets and
estimated from a bounded random sample on large ones; silent on proper splits and without a validation set;
reached through hs.preflight and `hookscope train --preflight`."""

import json
import math
import random

import numpy as np
import pytest
import torch
from faults import mlp
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

import hookscope as hs
from hookscope.cli import main
from hookscope.data.digits import digits_tensors
from hookscope.doctor.findings import Finding
from hookscope.doctor.preflight import train_valid_overlap


@pytest.fixture(scope="module")
def digits():
    """Normalised digits flattened to (n, 64): (x_train, y_train, x_valid, y_valid), split with seed 0."""
    x_train, y_train, x_valid, y_valid = digits_tensors()
    return x_train.flatten(1), y_train, x_valid.flatten(1), y_valid


def _one(findings: list[Finding]) -> Finding:
    (finding,) = [f for f in findings if f.kind == "train_valid_overlap"]
    return finding


def _leaky(digits, copies: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A validation set of 360 samples whose last ``copies`` are training samples 100, 110, ..."""
    x_train, y_train, x_valid, y_valid = digits
    picked = torch.arange(100, 100 + 10 * copies, 10)
    return torch.cat([x_valid[: 360 - copies], x_train[picked]]), torch.cat(
        [y_valid[: 360 - copies], y_train[picked]]
    )


def test_validation_that_is_the_training_set_is_all_found(digits):
    x_train, y_train, _, _ = digits
    finding = _one(train_valid_overlap((x_train, y_train), (x_train, y_train)))
    assert (finding.severity, finding.module, finding.step) == ("warning", "", 0)
    assert finding.evidence["found"] == finding.evidence["valid_checked"] == len(x_train)
    assert finding.evidence["estimated_share"] == 1.0
    assert finding.message.startswith("1,438 of 1,438 validation samples (100.0%) are also training samples")
    assert "train_test_split on unique samples" in finding.message


def test_ten_percent_copies_are_counted_exactly_with_their_indices(digits):
    x_train, y_train, _, _ = digits
    x_valid, y_valid = _leaky(digits, copies=36)
    finding = _one(train_valid_overlap(TensorDataset(x_train, y_train), TensorDataset(x_valid, y_valid)))
    evidence = finding.evidence
    assert (evidence["found"], evidence["valid_checked"], evidence["train_checked"]) == (36, 360, 1438)
    assert evidence["share_checked"] == evidence["estimated_share"] == pytest.approx(0.1)
    assert evidence["examples"][:2] == [{"valid": 324, "train": 100}, {"valid": 325, "train": 110}]
    assert evidence["sampling"] == "all 360 validation samples; all 1,438 training samples"
    assert "36 of 360 validation samples (10.0%)" in finding.message


def test_the_target_plays_no_part_only_the_inputs(digits):
    x_train, y_train, _, _ = digits
    relabelled = _one(train_valid_overlap((x_train, y_train), (x_train[:50], (y_train[:50] + 1) % 10)))
    assert relabelled.evidence["found"] == 50
    assert train_valid_overlap((x_train[:50], y_train[:50]), (x_train[50:100], y_train[:50])) == []


@pytest.mark.parametrize("seed", [0, 1])
def test_proper_random_splits_of_digits_are_silent(seed):
    x_train, y_train, x_valid, y_valid = digits_tensors(seed=seed)
    assert train_valid_overlap((x_train, y_train), (x_valid, y_valid)) == []


def test_no_validation_set_is_silent(digits):
    x_train, y_train, _, _ = digits
    assert train_valid_overlap(DataLoader(TensorDataset(x_train, y_train)), None) == []


def test_a_shuffled_loader_is_read_through_its_dataset_and_its_generators_are_restored(digits):
    x_train, y_train, _, _ = digits
    x_valid, y_valid = _leaky(digits, copies=36)
    generator = torch.Generator().manual_seed(3)
    train = DataLoader(TensorDataset(x_train, y_train), batch_size=64, shuffle=True, generator=generator)
    valid = DataLoader(TensorDataset(x_valid, y_valid), batch_size=64, num_workers=0)
    states = (
        random.getstate(),
        np.random.get_state()[1].copy(),
        torch.get_rng_state(),
        generator.get_state(),
    )
    finding = _one(train_valid_overlap(train, valid))
    assert finding.evidence["found"] == 36
    assert finding.evidence["examples"][0] == {"valid": 324, "train": 100}  # dataset indices, not batch order
    assert random.getstate() == states[0] and np.array_equal(np.random.get_state()[1], states[1])
    assert torch.equal(torch.get_rng_state(), states[2]) and torch.equal(generator.get_state(), states[3])


class DictDigits(Dataset):
    """Samples as dicts: an image and a label (the label key is a target, not an input)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"image": self.x[i].view(1, 8, 8), "label": self.y[i]}


class TwoInputs(Dataset):
    """Samples as ((image, mask), label) tuples: every input counts, the label does not."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple:
        return (self.x[i], self.x[i] > 0), self.y[i]


@pytest.mark.parametrize("kind", [DictDigits, TwoInputs])
def test_datasets_of_dicts_and_nested_tuples(digits, kind):
    x_train, y_train, _, _ = digits
    x_valid, y_valid = _leaky(digits, copies=36)
    finding = _one(train_valid_overlap(kind(x_train, y_train), kind(x_valid, y_valid)))
    assert finding.evidence["found"] == 36


def test_batches_without_random_access_are_read_from_the_start(digits):
    x_train, y_train, x_valid, y_valid = digits
    rows = torch.cat([x_train[100:120], x_valid[:340]])  # 20 training samples, then fresh ones
    batches = [(rows[i : i + 64], y_valid[i : i + 64]) for i in range(0, 360, 64)]
    finding = _one(train_valid_overlap((x_train[:300], y_train[:300]), batches, max_samples=300))
    evidence = finding.evidence
    assert (evidence["found"], evidence["valid_checked"], evidence["valid_total"]) == (20, 300, None)
    assert evidence["examples"][:2] == [{"valid": 0, "train": 100}, {"valid": 1, "train": 101}]
    assert "first 300 validation samples of the batches (their number unknown)" in finding.message


def test_a_large_set_is_sampled_and_the_share_estimated():
    """50,000 training and 50,000 validation rows, 5% of the validation rows copies of training rows.
    With 5,000 samples of each side, about 25 copies are matched (5,000 x 5% x 5,000/50,000): the
    estimate's binomial standard error is 5% / sqrt(25) = 1 point; the tolerance is 3 of them."""
    g = torch.Generator().manual_seed(1)
    train, valid = torch.randn(50_000, 8, generator=g), torch.randn(50_000, 8, generator=g)
    copied = torch.randperm(50_000, generator=g)[:2_500]
    valid[copied] = train[torch.randperm(50_000, generator=g)[:2_500]]
    for seed in (0, 1):
        finding = _one(train_valid_overlap(train, valid, max_samples=5_000, seed=seed))
        evidence = finding.evidence
        assert evidence["train_checked"] + evidence["valid_checked"] == 10_000
        assert (evidence["train_total"], evidence["valid_total"]) == (50_000, 50_000)
        assert evidence["estimated_share"] == pytest.approx(0.05, abs=0.03)
        assert finding.message.startswith(
            f"about {evidence['estimated_share']:.1%} of the validation samples"
        )
        assert "5,000 of 50,000 training samples, drawn at random (seed" in finding.message


def test_duplicates_the_data_itself_holds_are_not_a_split_mistake():
    """Every sample of the data twice, split at random: the copies cross the split as often as they
    stay together in the training set. A handful of them is silent; many are an info, not a warning."""
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(3_000, 8, generator=g)
    handful = torch.cat([rows, rows[:10]])[torch.randperm(3_010, generator=g)]
    assert train_valid_overlap(handful[:2_408], handful[2_408:]) == []
    doubled = torch.cat([rows, rows])[torch.randperm(6_000, generator=g)]
    finding = _one(train_valid_overlap(doubled[:4_800], doubled[4_800:]))
    assert finding.severity == "info" and finding.evidence["p_value"] > 1e-3
    assert finding.evidence["share_checked"] == pytest.approx(0.8, abs=0.05)
    assert "oversampling" in finding.message


def test_a_leak_on_top_of_the_datas_own_duplicates_is_a_warning():
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(3_000, 8, generator=g)
    doubled = torch.cat([rows, rows])[torch.randperm(6_000, generator=g)]
    train, valid = doubled[:4_800], doubled[4_800:].clone()
    valid[:600] = train[:600]  # half the validation set overwritten by training rows
    finding = _one(train_valid_overlap(train, valid))
    assert finding.severity == "warning" and finding.evidence["train_duplicate_share"] > 0.7
    assert "far more than the training set's own duplicates explain" in finding.message


def test_max_samples_must_be_positive(digits):
    with pytest.raises(ValueError, match="max_samples=0; pass max_samples >= 1"):
        train_valid_overlap(digits[0], digits[2], max_samples=0)


def test_preflight_checks_the_overlap_when_the_data_has_a_validation_part(digits):
    x_train, y_train, _, _ = digits
    x_valid, y_valid = _leaky(digits, copies=36)
    train = DataLoader(TensorDataset(x_train, y_train), batch_size=64, shuffle=True)
    valid = DataLoader(TensorDataset(x_valid, y_valid), batch_size=64)
    for data in (hs.DataLoaders(train, valid), (train, valid)):
        finding = _one(hs.preflight(mlp(3), data, nn.CrossEntropyLoss(), steps=5))
        assert finding.evidence["found"] == 36
    found = hs.preflight(mlp(3), train, nn.CrossEntropyLoss(), steps=5)
    assert not [f for f in found if f.kind == "train_valid_overlap"]


def test_hookscope_train_writes_the_overlap_to_preflight_json(tmp_path, digits):
    x_train, y_train, _, _ = digits
    data = tmp_path / "leak.pt"
    x = x_train[:256].view(-1, 1, 8, 8)
    torch.save({"x": x, "y": y_train[:256], "x_valid": x[:64], "y_valid": y_train[:64]}, data)
    out = tmp_path / "run"
    argv = ["train", "--data", str(data), "--preflight", "--no-doctor", "--epochs", "1", "--out", str(out)]
    assert main(argv) == 0
    (finding,) = [
        f for f in json.loads((out / "preflight.json").read_text()) if f["kind"] == "train_valid_overlap"
    ]
    assert finding["severity"] == "warning" and finding["evidence"]["found"] == 64
    assert math.isclose(finding["evidence"]["share_checked"], 1.0)
