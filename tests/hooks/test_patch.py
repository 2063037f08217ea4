"""hs.patch: outputs replaced for a block, per call, hooks gone afterwards (also on error)."""

import pytest
import torch
from torch import nn

import hookscope as hs
from hookscope.hooks.select import SelectionError


class Twice(nn.Module):
    """One block applied twice: a module called several times per forward."""

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(torch.relu(self.block(x))))


def hook_count(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def test_patch_replaces_outputs_and_restores_the_model_exactly() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(3, 4)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    before = model(x)
    with hs.patch(model, {"1": lambda out, module, name: out * 0}) as p:
        patched = model(x)
    assert torch.equal(patched, model[2].bias.expand(3, 2))
    assert p.applied == {"1": 1}
    assert hook_count(model) == 0
    assert torch.equal(model(x), before)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


def test_hooks_are_removed_when_the_block_raises() -> None:
    model = nn.Sequential(nn.Linear(4, 2))
    with pytest.raises(RuntimeError, match="boom"), hs.patch(model, {"0": lambda out, m, n: out}):
        raise RuntimeError("boom")
    assert hook_count(model) == 0

    def broken(out: torch.Tensor, module: nn.Module, name: str) -> torch.Tensor:
        raise ValueError("bad patch")

    with pytest.raises(ValueError, match="bad patch"), hs.patch(model, {"0": broken}):
        model(torch.randn(1, 4))
    assert hook_count(model) == 0


def test_per_call_patching_of_a_module_called_twice() -> None:
    torch.manual_seed(0)
    model = Twice()
    x = torch.randn(2, 4)
    with hs.capture(model, "block") as cap:
        model(x)
    first, second = cap.calls("block")
    zero = torch.zeros(2, 4)
    with hs.patch(model, {("block", 1): zero}) as p:
        out = model(x)
        model(x)  # counting restarts at each forward of the model
    assert torch.equal(out, model.head(zero))
    assert p.applied == {"block": 2}
    with hs.patch(model, {("block", 0): zero}), hs.capture(model, "block") as cap:
        model(x)
    assert torch.equal(cap.calls("block")[1], model.block(torch.relu(zero)))
    with hs.patch(model, {"block": [first, second]}):
        torch.testing.assert_close(model(x), model.head(second))


def test_activation_patching_between_a_clean_and_a_corrupted_input() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3))
    clean, corrupted = torch.randn(1, 6), torch.randn(1, 6)
    with torch.no_grad(), hs.capture(model, ["1", "3"]) as cap:
        clean_out = model(clean)
        corrupted_out = model(corrupted)
    assert not torch.allclose(clean_out, corrupted_out)
    with torch.no_grad():
        for name in ("1", "3"):  # every path runs through these layers: patching one restores the output
            with hs.patch(model, {name: cap.calls(name)[0]}):
                torch.testing.assert_close(model(corrupted), clean_out)
        half = cap.calls("3")[1].clone()
        half[:, :8] = cap.calls("3")[0][:, :8]  # a partial patch moves the output partway
        with hs.patch(model, {"3": half}):
            partial = model(corrupted)
    assert not torch.allclose(partial, clean_out) and not torch.allclose(partial, corrupted_out)


def test_bad_patches_are_explained() -> None:
    model = nn.Sequential(nn.Linear(4, 2))
    wrong_shape = pytest.raises(ValueError, match=r"shape \(5, 2\) but the module returns \(1, 2\)")
    with wrong_shape, hs.patch(model, {"0": torch.zeros(5, 2)}):
        model(torch.randn(1, 4))
    with pytest.raises(IndexError, match="one per call"), hs.patch(model, {"0": [torch.zeros(1, 2)]}):
        model(torch.randn(1, 4))
        model[0](torch.randn(1, 4))
    with pytest.raises(TypeError, match="non-empty dict"):
        hs.patch(model, {})
    with pytest.raises(SelectionError):
        hs.patch(model, {"nope": torch.zeros(1)})
    assert hook_count(model) == 0
