"""Activation and Taylor importance, measured through hooks, equal direct computations on captured tensors."""

import torch
from torch import nn
from torch.nn import functional as F

import hookscope as hs
from hookscope.models import digits_cnn
from hookscope.pruning.importance import activation_importance, importance


def model_and_data() -> tuple[nn.Module, list[tuple[torch.Tensor, torch.Tensor]]]:
    torch.manual_seed(0)
    model = digits_cnn().eval()
    generator = torch.Generator().manual_seed(2)
    data = [
        (torch.randn(n, 1, 8, 8, generator=generator), torch.randint(0, 10, (n,), generator=generator))
        for n in (16, 7)
    ]
    return model, data


def test_activation_importance_is_mean_abs_activation_per_channel_of_captured_outputs() -> None:
    model, data = model_and_data()
    scores = activation_importance(model, nn.Conv2d, data)
    with torch.no_grad(), hs.capture(model, nn.Conv2d) as cap:
        for x, _ in data:
            model(x)
    for name in cap.names:
        outputs = torch.cat(cap.calls(name))  # both batches, 23 samples
        expected = outputs.abs().mean(dim=(0, 2, 3))
        torch.testing.assert_close(scores[name], expected)


def test_activation_importance_of_inputs_and_of_linear_features() -> None:
    model, data = model_and_data()
    scores = activation_importance(model, "head.2", data, dim=1)
    with torch.no_grad(), hs.capture(model, "head.2", what="input") as cap:
        for x, _ in data:
            model(x)
    inputs = torch.cat(cap.calls("head.2"))
    torch.testing.assert_close(scores["head.2"], inputs.abs().mean(0))


def test_unstructured_activation_score_is_weight_times_input_activation() -> None:
    model, data = model_and_data()
    scores = importance(model, "head.2", "activation", data=data)
    inputs = activation_importance(model, "head.2", data, dim=1)["head.2"]
    torch.testing.assert_close(scores["head.2"], model.head[2].weight.detach().abs() * inputs)


def test_taylor_importance_is_activation_times_gradient_of_captured_tensors() -> None:
    model, data = model_and_data()
    scores = importance(model, nn.Conv2d, "taylor", structured=True, data=data, loss_func=F.cross_entropy)
    per_sample = {}
    for x, y in data:
        with hs.capture(model, nn.Conv2d, what=("output", "grad_output")) as cap:
            F.cross_entropy(model(x), y).backward()
        for name in cap.names:
            product = (cap[name, "output"] * cap[name, "grad_output"]).sum(dim=(2, 3)).abs()
            per_sample.setdefault(name, []).append(product)
    for name, parts in per_sample.items():
        torch.testing.assert_close(scores[name], torch.cat(parts).mean(0))


def test_unstructured_taylor_is_weight_times_its_gradient() -> None:
    model, data = model_and_data()
    scores = importance(model, "head.2", "taylor", data=data, loss_func=F.cross_entropy)
    model.zero_grad()
    for x, y in data:
        F.cross_entropy(model(x), y).backward()
    weight = model.head[2].weight
    torch.testing.assert_close(scores["head.2"], (weight * weight.grad).abs().detach())


def test_taylor_under_no_grad_still_takes_the_gradient() -> None:
    model, data = model_and_data()
    expected = importance(model, "head.2", "taylor", structured=True, data=data, loss_func=F.cross_entropy)
    with torch.no_grad():
        scores = importance(model, "head.2", "taylor", structured=True, data=data, loss_func=F.cross_entropy)
    torch.testing.assert_close(scores["head.2"], expected["head.2"])
