"""hs.preflight: every kind fires on its injected fault and names the module; healthy models give nothing;
the user's model, BatchNorm statistics and random generators are left as they were."""

import copy
import json
import random

import numpy as np
import pytest
import torch
from faults import BatchMixingView, MixesInForward, StopAfter, digits_raw_pixels, mlp
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchvision.models import mobilenet_v3_small, resnet18

import hookscope as hs
from hookscope.data.digits import digits_loaders, digits_tensors
from hookscope.doctor.findings import Finding
from hookscope.models import digits_cnn
from hookscope.models import mlp as mlp_of_sizes

pytestmark = pytest.mark.usefixtures("deterministic")


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread: these small batches gain nothing from two, and on a loaded machine two threads
    spin waiting for each other at every operator (tens of seconds instead of one or two)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _digits(n: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalised digits, flattened to (n, 64), and their labels."""
    x, y, _, _ = digits_tensors()
    return x[:n].flatten(1), y[:n]


def _found(model, data, loss_func=None, **kw) -> dict[str, list[Finding]]:
    torch.manual_seed(0)
    findings = hs.preflight(model, data, loss_func or nn.CrossEntropyLoss(), **kw)
    by_kind: dict[str, list[Finding]] = {}
    for f in findings:
        by_kind.setdefault(f.kind, []).append(f)
    return by_kind


def _regressor(activation: nn.Module | None = None) -> nn.Sequential:
    layers = [nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 1)]
    return nn.Sequential(*layers, *([activation] if activation else []))


# ---- batch_mixing ---------------------------------------------------------------------------------------


def test_batch_mixing_from_a_view_names_the_module():
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), BatchMixingView(), nn.Linear(32, 10))
    (finding,) = _found(model, _digits(), steps=10)["batch_mixing"]
    assert (finding.module, finding.severity) == ("2", "error")
    assert finding.evidence["modules"] == ["2"] and finding.evidence["probe_samples"] == 3
    assert "`2` (BatchMixingView)" in finding.message and "permute/transpose" in finding.message


def test_batch_mixing_in_the_models_own_forward_names_the_layer_before_it():
    x, y, _, _ = digits_tensors()
    (finding,) = _found(MixesInForward(), (x[:64], y[:64]), steps=10)["batch_mixing"]
    assert finding.module == ""
    assert "the model's own forward (MixesInForward)" in finding.message and "after `body`" in finding.message


def test_the_first_of_two_mixing_modules_is_named():
    model = nn.Sequential(
        nn.Linear(64, 32), BatchMixingView(), nn.Linear(32, 32), BatchMixingView(), nn.Linear(32, 10)
    )
    (finding,) = _found(model, _digits(), steps=10)["batch_mixing"]
    assert finding.module == "1" and finding.evidence["modules"] == ["1", "3"]


def test_an_lstm_without_batch_first_mixes_samples():
    x, y = _sequences()
    (finding,) = _found(LSTMClassifier(batch_first=False), (x, y), steps=10)["batch_mixing"]
    assert finding.module == "lstm" and "batch_first=True" in finding.message


def test_batchnorm_with_batch_statistics_is_not_reported_but_a_mix_behind_it_is():
    quiet = nn.Sequential(nn.Linear(64, 32), nn.BatchNorm1d(32, track_running_stats=False), nn.Linear(32, 10))
    assert "batch_mixing" not in _found(quiet, _digits(), steps=10)
    mixing = nn.Sequential(
        nn.Linear(64, 32), BatchMixingView(), nn.BatchNorm1d(32, track_running_stats=False), nn.Linear(32, 10)
    )
    (finding,) = _found(mixing, _digits(), steps=10)["batch_mixing"]
    assert finding.module == "1" and finding.evidence["modules"] == ["1"]


class SequenceFirstLSTM(nn.Module):
    """Correct code: 24 features read as a sequence of 3 steps, fed time-first to an LSTM. The sequence
    length (3) is made inside the model and equals the first probe size."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(8, 16)
        self.lstm = nn.LSTM(16, 32)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        steps = self.embed(x.view(len(x), 3, 8)).transpose(0, 1)  # (3, N, 16)
        out, _ = self.lstm(steps)
        return self.head(out[-1])


def test_a_time_dimension_the_size_of_the_probe_batch_is_not_taken_for_the_batch():
    x, y = _digits()
    assert "batch_mixing" not in _found(SequenceFirstLSTM(), (x[:, :24], y), steps=10)


# ---- output_loss_mismatch -------------------------------------------------------------------------------


def test_softmax_before_cross_entropy():
    (finding,) = _found(nn.Sequential(mlp(3), nn.Softmax(dim=1)), _digits())["output_loss_mismatch"]
    assert finding.module == "1" and finding.severity == "error"
    assert "already a softmax" in finding.message and "CrossEntropyLoss" in finding.message


def test_sigmoid_before_bce_with_logits():
    x, y = _digits()
    model = nn.Sequential(nn.Linear(64, 1), nn.Sigmoid())
    found = _found(model, (x, (y > 4).float()[:, None]), nn.BCEWithLogitsLoss())
    (finding,) = found["output_loss_mismatch"]
    assert finding.module == "1" and "BCEWithLogitsLoss applies one again" in finding.message


class SigmoidInForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(64, 1)

    def forward(self, x):
        return torch.sigmoid(self.linear(x))


def test_a_sigmoid_applied_in_forward_before_bce_with_logits():
    x, y = _digits()
    found = _found(SigmoidInForward(), (x, (y > 4).float()[:, None]), nn.BCEWithLogitsLoss())
    (finding,) = found["output_loss_mismatch"]
    assert "already went through a sigmoid (sigmoid)" in finding.message


def test_log_softmax_before_cross_entropy_is_harmless_and_quiet():
    assert "output_loss_mismatch" not in _found(nn.Sequential(mlp(3), nn.LogSoftmax(dim=1)), _digits())


def test_raw_scores_into_nll_loss():
    (finding,) = _found(mlp(3), _digits(), nn.NLLLoss())["output_loss_mismatch"]
    assert finding.module == "4" and "log_softmax" in finding.message


def test_a_sigmoid_output_cannot_reach_targets_up_to_nine():
    x, y = _digits()
    found = _found(_regressor(nn.Sigmoid()), (x, y.float()[:, None]), nn.MSELoss())
    (finding,) = found["output_loss_mismatch"]
    assert finding.module == "3" and finding.severity == "warning"
    assert finding.evidence["output_bounds"] == [0.0, 1.0] and finding.evidence["target_max"] == 9.0


def test_a_relu6_output_is_bounded_by_its_own_range():
    x, y = _digits()
    (finding,) = _found(_regressor(nn.ReLU6()), (x, y.float()[:, None]), nn.MSELoss())["output_loss_mismatch"]
    assert finding.evidence["output_bounds"] == [0.0, 6.0] and "(ReLU6)" in finding.message


def test_fewer_output_classes_than_the_labels_use():
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 5))
    found = _found(model, _digits())
    (finding,) = found["output_loss_mismatch"]
    assert finding.module == "2" and finding.evidence == {"output_classes": 5, "max_label": 9}
    assert "init_loss" not in found and "cannot_overfit" not in found  # the loss would fail: not run


def test_regression_output_that_broadcasts_against_its_targets():
    x, y = _digits()
    (finding,) = _found(_regressor(), (x, y.float()), nn.MSELoss())["output_loss_mismatch"]
    assert finding.evidence == {"output_shape": [128, 1], "target_shape": [128]}
    assert "broadcast to (128, 128)" in finding.message


# ---- label_problem --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("labels", "loss_func", "words"),
    [
        (lambda y: torch.zeros_like(y), nn.CrossEntropyLoss(), "one class only"),
        (lambda y: y - 1, nn.CrossEntropyLoss(), "class labels reach -1"),
        (lambda y: torch.full((len(y), 1), 3.0), nn.MSELoss(), "every regression target equals 3"),
        (lambda y: y.float()[:, None], nn.BCEWithLogitsLoss(), "binary targets reach 0 .. 9"),
    ],
)
def test_label_problems(labels, loss_func, words):
    x, y = _digits()
    model = _regressor() if isinstance(loss_func, nn.MSELoss | nn.BCEWithLogitsLoss) else mlp(3)
    (finding,) = _found(model, (x, labels(y)), loss_func)["label_problem"]
    assert finding.severity == "error" and words in finding.message


def test_ignored_labels_are_not_out_of_range():
    x, y = _digits()
    y = y.clone()
    y[::4] = -100
    assert "label_problem" not in _found(mlp(3), (x, y))


# ---- input_scale ----------------------------------------------------------------------------------------


def test_raw_pixels_are_named_with_the_layer_they_enter():
    x, y = digits_raw_pixels()
    (finding,) = _found(mlp(3), (x[:256], y[:256]))["input_scale"]
    assert finding.module == "0" and "raw 0-255 pixel values" in finding.message
    assert finding.evidence["max"] == 255.0


def test_one_feature_a_thousand_times_the_others():
    x, y = _digits()
    x = x.clone()
    x[:, 20] *= 1000
    (finding,) = _found(mlp(3), (x, y))["input_scale"]
    assert finding.evidence["feature"] == 20 and finding.evidence["ratio"] > 100


# ---- init_loss and cannot_overfit -----------------------------------------------------------------------


def test_large_initial_logits_name_the_last_layer():
    model = mlp(3)
    with torch.no_grad():
        model[4].weight.mul_(100.0)
    (finding,) = _found(model, _digits())["init_loss"]
    assert finding.module == "4" and finding.evidence["ratio"] > 2
    assert finding.evidence["expected"] == pytest.approx(np.log(10))


def test_regression_targets_far_from_zero_ask_for_the_bias():
    x, y = _digits()
    found = _found(_regressor(), (x, 50 + y.float()[:, None]), nn.MSELoss())
    (finding,) = found["init_loss"]
    assert finding.module == "2" and "bias" in finding.message and finding.evidence["target_mean"] > 50


def test_a_learning_rate_far_too_small_cannot_overfit_one_batch():
    (finding,) = _found(mlp(3), _digits(), lr=1e-7, steps=50)["cannot_overfit"]
    assert finding.evidence["steps"] == 50 and finding.evidence["samples"] == 16
    assert finding.evidence["best"] > finding.evidence["goal"] and finding.severity == "error"


def test_a_loss_that_falls_too_slowly_is_a_warning():
    x, y = _digits()
    found = _found(_regressor(), (x, 50 + y.float()[:, None]), nn.MSELoss())
    (finding,) = found["cannot_overfit"]
    assert finding.severity == "warning" and "too slowly" in finding.message
    assert finding.evidence["best"] < 0.5 * finding.evidence["start"]


def test_overfitting_stops_as_soon_as_the_goal_is_reached():
    calls = []

    def loss_func(out, y):
        calls.append(1)
        return nn.functional.cross_entropy(out, y)

    assert _found(mlp(3), _digits(), loss_func=loss_func) == {}
    assert len(calls) < 150  # far below the 300 steps allowed (plus the forward of the init-loss check)


# ---- healthy models: nothing to say ---------------------------------------------------------------------


def _sequences(n: int = 128, length: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    """Token sequences (vocabulary 4..19) holding one marker token 0..3 at a random place: the label."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(4, 20, (n, length), generator=g)
    y = torch.randint(0, 4, (n,), generator=g)
    x[torch.arange(n), torch.randint(0, length, (n,), generator=g)] = y
    return x, y


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 32)
        self.position = nn.Parameter(torch.zeros(12, 32))
        layer = nn.TransformerEncoderLayer(32, nhead=4, dim_feedforward=64, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        return self.head(self.encoder(self.embed(x) + self.position).mean(1))


class LSTMClassifier(nn.Module):
    def __init__(self, batch_first: bool = True):
        super().__init__()
        self.embed = nn.Embedding(20, 32)
        self.lstm = nn.LSTM(32, 64, batch_first=batch_first)
        self.head = nn.Linear(64, 4)

    def forward(self, x):
        out, _ = self.lstm(self.embed(x))
        return self.head(out[:, -1])


def _upscaled_digits() -> DataLoader:
    x, y, _, _ = digits_tensors(size=32)
    return DataLoader(TensorDataset(x[:64].repeat(1, 3, 1, 1), y[:64]), batch_size=16, shuffle=True)


def test_digits_cnn_is_quiet():
    torch.manual_seed(0)
    assert hs.preflight(digits_cnn(), digits_loaders(), nn.CrossEntropyLoss()) == []


@pytest.mark.parametrize("build", [resnet18, mobilenet_v3_small])
def test_torchvision_models_on_upscaled_digits_are_quiet(build):
    torch.manual_seed(0)
    assert hs.preflight(build(weights=None, num_classes=10), _upscaled_digits(), nn.CrossEntropyLoss()) == []


@pytest.mark.parametrize("build", [Encoder, LSTMClassifier])
def test_sequence_classifiers_are_quiet(build):
    torch.manual_seed(0)
    x, y = _sequences()
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
    assert hs.preflight(build(), loader, nn.CrossEntropyLoss()) == []


@pytest.mark.parametrize("loss_func", [nn.BCEWithLogitsLoss(), nn.BCELoss()])
def test_binary_classifier_is_quiet(loss_func):
    x, y = _digits(256)
    head = [nn.Sigmoid()] if isinstance(loss_func, nn.BCELoss) else []
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 1), *head)
    loader = DataLoader(TensorDataset(x, (y > 4).float()[:, None]), batch_size=32, shuffle=True)
    assert hs.preflight(model, loader, loss_func) == []


@pytest.mark.parametrize("loss_func", [nn.MSELoss(), nn.L1Loss(), nn.HuberLoss()])
def test_mlp_regression_is_quiet(loss_func):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 8, generator=g)
    y = x[:, :1] * 2 + torch.sin(3 * x[:, 1:2])
    torch.manual_seed(0)
    model = mlp_of_sizes((8, 64, 64, 1))
    loader = DataLoader(TensorDataset(x, (y - y.mean()) / y.std()), batch_size=32, shuffle=True)
    assert hs.preflight(model, loader, loss_func) == []


# ---- the user's state stays as it was ---------------------------------------------------------------------


def test_model_batchnorm_statistics_and_random_generators_are_untouched():
    torch.manual_seed(0)
    model = digits_cnn().eval()
    train_dl, valid_dl = digits_loaders()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    states = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
    loader_state = train_dl.generator.get_state()

    hs.preflight(model, (train_dl, valid_dl), nn.CrossEntropyLoss())

    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert int(after["features.0.1.num_batches_tracked"]) == 0 and not model.training
    assert all(p.grad is None for p in model.parameters())
    assert random.getstate() == states[0] and np.array_equal(np.random.get_state()[1], states[1])
    assert torch.equal(torch.get_rng_state(), states[2])
    assert torch.equal(train_dl.generator.get_state(), loader_state)


def test_every_form_of_data_gives_the_same_findings():
    x, y = _digits()
    model = nn.Sequential(mlp(3), nn.Softmax(dim=1))
    loader = DataLoader(TensorDataset(x, y), batch_size=64)
    forms = [loader, (loader, None), hs.DataLoaders(loader, None), (x[:64], y[:64])]
    messages = [[str(f) for f in hs.preflight(model, data, nn.CrossEntropyLoss())] for data in forms]
    assert messages[0] and all(m == messages[0] for m in messages)


def test_data_that_is_not_data_is_refused_in_one_line():
    with pytest.raises(TypeError, match="preflight: data of type int is not a DataLoader"):
        hs.preflight(mlp(3), 3, nn.CrossEntropyLoss())
    empty = DataLoader(TensorDataset(torch.zeros(0, 64), torch.zeros(0, dtype=torch.long)), batch_size=4)
    with pytest.raises(ValueError, match="yields no batch"):
        hs.preflight(mlp(3), empty, nn.CrossEntropyLoss())


# ---- Doctor(preflight=True) -------------------------------------------------------------------------------


def _fit_with(doctor: hs.callbacks.Doctor, model: nn.Module, tmp_path, steps: int = 6) -> hs.Learner:
    torch.manual_seed(0)
    x, y = _digits(256)
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
    folder = hs.callbacks.RunFolder(tmp_path / "run", figures=False)
    learn = hs.Learner(model, (loader, None), nn.CrossEntropyLoss(), cbs=[doctor, folder], progress=False)
    learn.fit(1, cbs=[StopAfter(steps)])
    return learn


def test_doctor_preflight_reports_before_training_and_leaves_the_run_as_it_would_be(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(mlp(3), nn.Softmax(dim=1))
    twin = copy.deepcopy(model)
    doctor = hs.callbacks.Doctor(preflight=True, quiet=True)
    learn = _fit_with(doctor, model, tmp_path / "with")
    (finding,) = doctor.preflight_findings
    assert (finding.kind, finding.module) == ("output_loss_mismatch", "1")
    assert finding in doctor.findings
    written = json.loads((tmp_path / "with" / "run" / "preflight.json").read_text())
    assert [f["kind"] for f in written] == ["output_loss_mismatch"]

    plain = _fit_with(hs.callbacks.Doctor(quiet=True), twin, tmp_path / "without")
    assert not (tmp_path / "without" / "run" / "preflight.json").exists()
    for a, b in zip(learn.model.parameters(), plain.model.parameters(), strict=True):
        assert torch.equal(a, b)  # the same training: preflight drew nothing from the run's generators
