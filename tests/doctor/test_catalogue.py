"""The fault catalogue: each injected fault is found within a few steps and names the right layer."""

from functools import partial

import torch
from faults import (
    Branches,
    LogAct,
    SqrtAbs,
    digits_flat,
    kinds,
    mlp,
    optimizer_without,
    tiny_train_digits,
    train_with_doctor,
)
from torch import nn


def test_exploding_gradient_names_the_layer_where_growth_passes_100x():
    torch.manual_seed(0)
    model = mlp(depth=8)
    with torch.no_grad():
        for layer in model:
            if isinstance(layer, nn.Linear):
                layer.weight.mul_(10.0)  # weights scaled up layer after layer
    learn = train_with_doctor(model, steps=6)
    (finding,) = kinds(learn)["exploding_gradient"]
    growth = finding.evidence["layers"]
    assert finding.module == "7" and finding.step == 0
    assert growth["7"] > 100 and all(g > 100 for g in growth.values())
    assert "`7`" in finding.message and "clipping" in finding.message


def test_exploding_gradient_from_a_far_too_large_learning_rate():
    torch.manual_seed(0)
    learn = train_with_doctor(mlp(depth=3), lr=10.0, opt_func=torch.optim.SGD, steps=8)
    found = kinds(learn)
    assert "exploding_gradient" in found and "loss_divergence" in found
    assert found["exploding_gradient"][0].step <= 5


def test_vanishing_gradient_in_a_deep_sigmoid_mlp_names_the_earliest_layers():
    torch.manual_seed(0)
    learn = train_with_doctor(mlp(depth=12, width=32, act=nn.Sigmoid), steps=6)
    (finding,) = kinds(learn)["vanishing_gradient"]
    assert finding.module == "0"
    assert finding.evidence["layers"][:3] == ["0", "2", "4"]
    assert finding.evidence["ratio_to_largest"] < 1e-4


def test_dead_relus_from_a_large_negative_bias_name_the_layer_and_fraction():
    torch.manual_seed(0)
    model = mlp(depth=3)
    with torch.no_grad():
        model[2].bias.fill_(-10.0)
    learn = train_with_doctor(model, steps=6)
    (finding,) = kinds(learn)["dead_units"]
    assert (finding.module, finding.evidence["producer"], finding.step) == ("3", "2", 0)
    assert finding.evidence["dead_fraction"] == 1.0
    assert finding.message.startswith("layer `3` — 100% of units dead since step 0")
    assert "vanishing_gradient" not in kinds(learn)  # zero gradient behind dead units is not "vanishing"


def test_saturated_tanh_after_inputs_scaled_100x():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 10))
    learn = train_with_doctor(model, digits_flat(scale=100.0), steps=6)
    (finding,) = kinds(learn)["saturation"]
    assert finding.module == "1" and finding.evidence["activation"] == "tanh"
    assert finding.evidence["saturated_fraction"] > 0.9


def test_forward_nan_from_log_is_blamed_on_the_module_and_op():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), LogAct(), nn.Linear(32, 10))
    learn = train_with_doctor(model)
    (finding,) = kinds(learn)["nonfinite"]
    e = finding.evidence
    assert (finding.module, e["phase"], e["op"], e["module_type"]) == ("1", "forward", "aten.log", "LogAct")
    assert finding.severity == "error" and learn.training_step == 0
    assert all(p.isfinite().all() for p in learn.model.parameters())


def test_backward_only_nan_from_sqrt_at_zero_is_blamed_on_the_module():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32, bias=False), SqrtAbs(), nn.Linear(32, 10))
    learn = train_with_doctor(model, digits_flat(zero_row=70))  # row 70 is in the second batch
    (finding,) = kinds(learn)["nonfinite"]
    e = finding.evidence
    assert (finding.module, e["phase"], e["op"], finding.step) == ("1", "backward", "SqrtBackward0", 1)


def test_unused_and_detached_branches_get_no_gradient_findings_naming_their_parameters():
    torch.manual_seed(0)
    learn = train_with_doctor(Branches(), steps=6)
    found = {f.module: f for f in kinds(learn)["no_gradient"]}
    assert set(found) == {"unused", "aux"}
    assert found["unused"].evidence["parameters"] == ["unused.weight", "unused.bias"]
    assert "update_ratio" not in kinds(learn)  # no update because no gradient: not a learning-rate problem


def test_diverging_loss_with_a_learning_rate_100x_too_large():
    torch.manual_seed(0)
    learn = train_with_doctor(mlp(depth=3), lr=10.0, opt_func=torch.optim.SGD, steps=10)
    (finding,) = kinds(learn)["loss_divergence"]
    assert finding.step <= 6 and finding.evidence["loss"] > 4 * finding.evidence["best"]


def test_update_ratio_far_above_1e3_with_a_huge_adam_learning_rate():
    torch.manual_seed(0)
    learn = train_with_doctor(mlp(depth=3), lr=0.1, steps=6)
    modules = {f.module for f in kinds(learn)["update_ratio"]}
    assert modules == {"0", "2", "4"}
    assert all(f.evidence["update_ratio"] > 0.3 for f in kinds(learn)["update_ratio"])


def test_frozen_parameters_are_reported_once_as_information():
    torch.manual_seed(0)
    model = mlp(depth=3)
    model[0].requires_grad_(False)
    learn = train_with_doctor(model, steps=4)
    (finding,) = kinds(learn)["frozen"]
    assert finding.severity == "info" and finding.evidence["modules"] == {"0": 64 * 64 + 64}


def test_a_layer_missing_from_the_optimizer_is_not_updated_and_named():
    torch.manual_seed(0)
    model = mlp(depth=3)
    learn = train_with_doctor(model, opt_func=optimizer_without(model[2]), steps=6)
    (finding,) = kinds(learn)["not_updated"]
    assert (finding.module, finding.step) == ("2", 0)
    assert finding.evidence["parameters"] == ["2.weight", "2.bias"]
    assert "not in the optimizer" in finding.message
    assert "update_ratio" not in kinds(learn)  # a ratio of exactly 0 is not "too small"


def test_a_learning_rate_50x_too_high_oscillates():
    torch.manual_seed(0)  # SGD with momentum trains this MLP well at lr 0.01
    sgd = partial(torch.optim.SGD, momentum=0.9)
    learn = train_with_doctor(mlp(depth=3), lr=0.5, opt_func=sgd, epochs=3, steps=60)
    found = kinds(learn)
    (finding,) = found["oscillating_loss"]
    assert finding.evidence["recent"] > 0.9 * finding.evidence["start"]
    assert finding.evidence["spread"] > 0.5
    assert "lower the learning rate" in finding.message
    assert "plateau" not in found
    # The loss bounces 1.1..7.1 around 2.5. Whether one of its spikes crosses loss_divergence's bar (a
    # 3-loss mean at 4x the best) depends on the CPU's float rounding over 60 chaotic steps: on an
    # AVX-512 machine one reached 4.01x (stop 42), elsewhere none did. A crossing holds its evidence.
    for divergence in found.get("loss_divergence", []):
        assert divergence.evidence["loss"] > 4.0 * divergence.evidence["best"]


def test_a_learning_rate_far_too_low_is_a_plateau_that_never_started():
    torch.manual_seed(0)
    learn = train_with_doctor(mlp(depth=3), lr=1e-6, epochs=3, steps=60)
    (finding,) = kinds(learn)["plateau"]
    assert "never started to fall" in finding.message
    assert finding.evidence["spread"] < 0.5 and finding.evidence["recent"] > 0.95 * finding.evidence["start"]
    assert "oscillating_loss" not in kinds(learn)


def test_a_dead_network_is_a_plateau_as_well_as_dead_units():
    torch.manual_seed(0)
    model = mlp(depth=3)
    with torch.no_grad():
        model[0].bias.fill_(-10.0)
    learn = train_with_doctor(model, epochs=3, steps=60)
    assert kinds(learn)["dead_units"][0].module == "1"
    assert "plateau" in kinds(learn)


def test_overfitting_a_tiny_training_set_names_the_best_epoch():
    torch.manual_seed(0)
    learn = train_with_doctor(mlp(depth=3, width=256), tiny_train_digits(32), lr=1e-2, epochs=8)
    (finding,) = kinds(learn)["overfitting"]
    history = learn.recorder.history
    best = min(range(len(history)), key=lambda i: history[i]["valid_loss"])
    assert finding.evidence["best_epoch"] == best and finding.step == best + 1  # one step per epoch
    assert finding.evidence["valid_losses"][-1] > 1.1 * history[best]["valid_loss"]
    assert "EarlyStopping" in finding.message
