"""hs.compare: two models on the same inputs, the first module where they part, and the op where it starts."""

import copy

import pytest
import torch
import torchvision
from matplotlib.figure import Figure
from torch import nn

import hookscope as hs
from hookscope.hooks.compare import Comparison


class Halved(torch.autograd.Function):
    """The identity forward, with a backward that halves the gradient: only the backward differs."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * 0.5


class Gate(nn.Module):
    def __init__(self, halve: bool = False) -> None:
        super().__init__()
        self.halve = halve

    def forward(self, x):
        return Halved.apply(x) if self.halve else x.clone()


class Port(nn.Module):
    """The Sequential of :func:`mlp` written again with names of its own, as a port would."""

    def __init__(self) -> None:
        super().__init__()
        self.fc_in, self.act, self.gate, self.fc_out = nn.Linear(4, 8), nn.Tanh(), Gate(), nn.Linear(8, 3)

    def forward(self, x):
        return self.fc_out(self.gate(self.act(self.fc_in(x))))


def mlp(gate: nn.Module | None = None, hidden: int = 8) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), gate or Gate(), nn.Linear(hidden, 3))


X, Y = torch.randn(5, 4, generator=torch.Generator().manual_seed(1)), torch.tensor([0, 1, 2, 0, 1])


@pytest.fixture(scope="module")
def resnets():
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    nudged = copy.deepcopy(model)
    with torch.no_grad():
        nudged.layer3[0].conv2.weight.mul_(1.01)
    return model, nudged, torch.randn(2, 3, 64, 64)


def test_a_weight_nudged_by_one_percent_is_found_in_resnet18(resnets):
    model, nudged, x = resnets
    result = hs.compare(model, nudged, x)
    assert isinstance(result, Comparison)
    assert result.first_divergent == "layer3.0.conv2" and result.phase == "forward"
    assert result.op == "aten.convolution"
    row = result.layer("layer3.0.conv2")
    assert row.beyond and 0.003 < row.max_rel < 0.03  # 1% of the weights, less after the sum over inputs
    # everything before it matches exactly; the layers after it differ only because they inherit it
    at = [row.name for row in result.layers].index("layer3.0.conv2")
    assert at == 40 and all(row.max_abs == 0 for row in result.layers[:at])
    # the shortcut runs later but does not see the nudged layer: it still matches
    assert not result.layer("layer3.0.downsample.0").beyond
    assert result.layer("layer3.0.bn2").beyond and result.layer("fc").beyond
    assert "`layer3.0.conv2` (Conv2d)" in str(result) and "aten.convolution" in str(result)


def test_the_same_model_agrees_and_is_left_as_found(resnets):
    model, _, x = resnets
    model.train()  # BatchNorm updates its running statistics: they must be put back
    try:
        before = {k: v.clone() for k, v in model.state_dict().items()}
        result = hs.compare(model, copy.deepcopy(model), x)
        after = model.state_dict()
    finally:
        model.eval()
    assert result.identical and result.first_divergent is None
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert str(result).startswith("The two models agree")
    assert repr(result) == "Comparison(first_divergent=None, phase=None, op=None, 76 module calls)"
    assert sum(1 for m in model.modules() for _ in m._forward_hooks) == 0


def test_a_port_with_renamed_modules_is_matched_through_names():
    model, port = mlp(), Port()
    port.fc_in.load_state_dict(model[0].state_dict())
    port.fc_out.load_state_dict(model[3].state_dict())
    names = {"0": "fc_in", "1": "act", "2": "gate", "3": "fc_out"}
    assert hs.compare(model, port, X, names=names).identical
    with torch.no_grad():
        port.fc_out.bias.add_(0.01)
    result = hs.compare(model, port, X, names=names)
    assert result.first_divergent == "3" and result.layer("3").name_b == "fc_out"
    assert result.op == "aten.addmm"
    assert "`3` (Linear; `fc_out` in model_b)" in result.paragraph()
    unmatched = hs.compare(model, port, X)  # without names= nothing matches: said, not crashed on
    assert unmatched.only_in_a == ["0", "1", "2", "3"] and "fc_in" in unmatched.only_in_b


def test_a_name_that_is_not_a_module_is_refused():
    with pytest.raises(KeyError, match="'fc_inn', which is not a module of model_b"):
        hs.compare(mlp(), Port(), X, names={"0": "fc_inn"})


def test_a_difference_only_in_the_backward_is_blamed_on_its_module_and_node():
    loss = nn.CrossEntropyLoss()
    plain = hs.compare(mlp(Gate()), mlp(Gate(halve=True)), X)
    assert plain.identical  # the forward passes are the same
    result = hs.compare(mlp(Gate()), mlp(Gate(halve=True)), X, loss_func=loss, target=Y)
    assert result.first_divergent == "2" and result.phase == "backward"
    assert result.op == "CloneBackward0 / HalvedBackward"
    assert not any(row.beyond for row in result.layers)
    # the layers before it get a different gradient: they inherit it, they are not blamed
    assert result.layer("0").grad_beyond and result.layer("1").grad_beyond
    assert result.layer("0").param_grad_max_abs > 0
    assert not result.layer("3").grad_beyond
    assert "backward passes part at `2` (Gate)" in str(result)


class Scaled(nn.Module):
    """Two submodules with code of its own between them: ``x * scale``."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.a, self.b, self.scale = nn.Linear(4, 8), nn.Linear(8, 8), scale

    def forward(self, x):
        return self.b(self.a(x) * self.scale)


def test_a_difference_made_by_a_containers_own_code_is_blamed_on_the_container():
    torch.manual_seed(0)
    model = nn.Sequential(Scaled(1.0), nn.Tanh())
    other = copy.deepcopy(model)
    other[0].scale = 1.5
    result = hs.compare(model, other, X)
    # `0.b` is the first output that differs, but its input already did: `0`'s own code made it
    assert result.layer("0.b").beyond and not result.layer("0.a").beyond
    assert result.first_divergent == "0" and result.op == "aten.mul"
    assert "the input of `0.b` inside it already differs" in result.reason


class Cut(nn.Module):
    def forward(self, x):
        return x.detach()


def test_a_gradient_path_cut_by_a_detach_is_found_where_the_gradient_stops():
    loss = nn.CrossEntropyLoss()
    result = hs.compare(mlp(nn.Identity()), mlp(Cut()), X, loss_func=loss, target=Y)
    assert result.phase == "backward" and result.first_divergent == "3"
    assert "no gradient reaches its input in model_b" in result.reason
    assert result.layer("0").note == "no gradient reaches its output in model_b"


def test_shapes_that_differ_are_reported_not_crashed_on():
    result = hs.compare(mlp(hidden=8), mlp(hidden=6), X)
    assert result.first_divergent == "0"
    row = result.layer("0")
    assert (row.shape_a, row.shape_b) == ((5, 8), (5, 6)) and row.max_abs is None
    assert "shapes differ: 5×8 in model_a, 5×6 in model_b" in str(result)
    assert result.layer("3").beyond and result.layer("3").shape_a == result.layer("3").shape_b


def test_dropout_draws_the_same_masks_in_both_models():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Dropout(0.5), nn.Linear(16, 3)).train()
    assert hs.compare(model, copy.deepcopy(model), X).identical


def test_text_html_and_figure_show_every_module(resnets):
    model, nudged, x = resnets
    result = hs.compare(model, nudged, x)
    text = str(result)
    paragraph, table = text.split("\n\n", 1)
    later = sum(row.beyond for row in result.layers) - 1
    assert later == 32 and f"The {later} other differences follow from it." in paragraph
    assert len(table.splitlines()) == len(result.layers) + 2
    assert "<- first" in next(line for line in table.splitlines() if line.startswith("layer3.0.conv2 "))
    page = result._repr_html_()
    assert page.count("<tr") == len(result.layers) + 1 and "layer3.0.conv2" in page
    fig = hs.viz.comparison_plot(result)
    assert isinstance(fig, Figure)
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.get_xticklabels()][: len(result.layers)][-1] == "<output>"
    assert "layer3.0.conv2" in ax.get_title()
