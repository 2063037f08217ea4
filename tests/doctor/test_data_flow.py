"""The data flow between watched layers (which layer produced each layer's input), and the dead units
it lets the doctor name: those of the PyTorch examples' MNIST ``Net``, whose activations are functional."""

import pytest
import torch
import torch.nn.functional as F
from odd_runs import MnistNet  # mnist/main.py's Net: functional activations between modules
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hookscope as hs
from hookscope.data.digits import digits_tensors
from hookscope.doctor.data_flow import DataFlow


def _flow(model: nn.Module, *inputs: torch.Tensor) -> dict[str, str | None]:
    """The producers a DataFlow learns from one forward of ``model`` on ``inputs``."""
    flow = DataFlow()
    handles = [
        module.register_forward_hook(lambda m, args, out, name=name: flow.observe(name, args, out))
        for name, module in model.named_modules()
        if next(module.children(), None) is None
    ]
    model(*inputs)
    for handle in handles:
        handle.remove()
    flow.settle()
    return flow.producers


def test_producers_follow_the_data_through_functional_ops_not_the_registration_order():
    producers = _flow(MnistNet(), torch.randn(2, 1, 28, 28))
    assert producers == {
        "conv1": None,
        "conv2": "conv1",  # through F.relu
        "dropout1": "conv2",  # through F.relu and F.max_pool2d
        "dropout2": "fc1",  # through F.relu, although dropout1 was registered just before it
        "fc1": "dropout1",  # through torch.flatten
        "fc2": "dropout2",
    }


def test_producers_across_an_inplace_relu_a_reused_module_and_a_frozen_layer():
    bn_relu = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(inplace=True), nn.Linear(8, 2))
    assert _flow(bn_relu, torch.randn(3, 4)) == {"0": None, "1": "0", "2": "1", "3": "2"}

    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.a(self.b(self.a(x)))  # `a` is called twice: its first input is the data

    assert _flow(Twice(), torch.randn(3, 4)) == {"a": None, "b": "a"}
    frozen = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
    frozen[0].requires_grad_(False)  # its output has no graph: matched by storage
    assert _flow(frozen, torch.randn(3, 4)) == {"0": None, "1": "0"}


def _mnist_loader(steps: int = 8) -> DataLoader:
    """The digits upscaled to 28x28 and normalised as mnist/main.py normalises MNIST, batches of 64."""
    x, y, _, _ = digits_tensors(size=28)
    n = 64 * steps
    return DataLoader(TensorDataset(x[:n], y[:n]), batch_size=64)


def _fit(loop: str) -> list[hs.Finding]:
    """mnist/main.py's training (Adadelta at lr 1.0) for 8 steps, in the Learner or under hs.watch."""
    torch.manual_seed(1)
    model, train = MnistNet(), _mnist_loader()
    if loop == "learner":
        doctor = hs.callbacks.Doctor(quiet=True)
        learn = hs.Learner(
            model, (train, None), F.nll_loss, torch.optim.Adadelta, 1.0, cbs=[doctor], progress=False
        )
        learn.fit(1)
        return doctor.findings
    opt = torch.optim.Adadelta(model.parameters(), lr=1.0)
    with hs.watch(model, opt, quiet=True) as w:
        for x, y in train:
            loss = F.nll_loss(model(x), y)
            w.log(loss)
            loss.backward()
            opt.step()
            opt.zero_grad()
    return w.findings


@pytest.mark.parametrize("loop", ["learner", "plain"])
def test_dead_units_behind_a_functional_relu_are_named_at_their_layer_with_their_input(loop):
    torch.manual_seed(1)
    truth, model = [], MnistNet()
    model.fc1.register_forward_hook(
        lambda m, a, out: truth.append(float((F.relu(out) == 0).all(0).float().mean()))
    )
    opt = torch.optim.Adadelta(model.parameters(), lr=1.0)
    for x, y in _mnist_loader():
        F.nll_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    assert min(truth[3:]) > 0.5  # the plain hook: most of fc1's ReLU outputs are 0 for the whole batch

    (finding,) = [f for f in _fit(loop) if f.kind == "dead_units"]
    assert (finding.module, finding.evidence["seen_at"], finding.evidence["producer"]) == (
        "fc1",
        "dropout2",
        "conv2",
    )
    assert finding.evidence["dead_fraction"] == pytest.approx(truth[-1], abs=0.1)
    assert "layer `fc1`" in finding.message and "seen at `dropout2`" in finding.message
    assert "its input comes from `conv2`" in finding.message
