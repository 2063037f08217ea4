"""hs.ablate: a useless branch costs nothing, the only path costs a lot; per-unit and mean ablation."""

import pytest
import torch
from torch import nn

import hookscope as hs
from hookscope.data.digits import digits_tensors
from hookscope.models import digits_cnn


class TwoPaths(nn.Module):
    """``main`` carries everything; ``branch`` is multiplied by zero, so it cannot matter."""

    def __init__(self) -> None:
        super().__init__()
        self.main = nn.Linear(5, 3)
        self.branch = nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.main(x) + 0.0 * self.branch(x)


def data() -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 5, generator=generator)
    return [(x[:40], x[:40, :3].argmax(1)), (x[40:], x[40:, :3].argmax(1))]


def trained_two_paths() -> TwoPaths:
    """``main`` set by hand to the perfect classifier of :func:`data` (logits 5 * x[:, :3])."""
    torch.manual_seed(0)
    model = TwoPaths()
    with torch.no_grad():
        model.main.weight.copy_(5 * torch.eye(3, 5))
        model.main.bias.zero_()
    return model


@pytest.mark.parametrize("how", ["zero", "mean"])
def test_a_branch_multiplied_by_zero_has_no_effect_and_the_only_path_a_large_one(how: str) -> None:
    model = trained_two_paths()
    table = hs.ablate(model, ["main", "branch"], data(), how=how)
    assert table.effect("branch") == 0.0
    assert table.effect("main") > 0.5
    assert [row.name for row in table.rows] == ["main", "branch"]
    assert table.baseline < 0.3
    assert "branch" in str(table)


def test_metric_accuracy_and_model_left_as_it_was() -> None:
    model = trained_two_paths().train()

    def accuracy(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return (pred.argmax(1) == target).float().mean()

    x = torch.randn(2, 5)
    with torch.no_grad():
        before = model(x)
    table = hs.ablate(model, ["main", "branch"], data(), metric=accuracy)
    assert table.metric_name == "accuracy" and table.baseline > 0.9
    assert table.effect("main") < -0.4  # accuracy drops to about chance
    assert model.training and all(not m._forward_hooks for m in model.modules())
    with torch.no_grad():
        assert torch.equal(model(x), before)


def test_per_unit_ablation_of_one_layer() -> None:
    model = trained_two_paths()
    table = hs.ablate(model, "main", data(), per="unit")
    assert sorted(row.unit for row in table.rows) == [0, 1, 2]
    # each of main's three outputs is one class's logit: removing any of them costs accuracy
    assert all(row.effect > 0 for row in table.rows)
    with pytest.raises(ValueError, match="one module"):
        hs.ablate(model, ["main", "branch"], data(), per="unit")


def test_mean_ablation_per_unit_fills_the_units_mean() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 3), nn.Identity())
    batches = data()
    mean_of_unit0 = torch.cat([model(x) for x, _ in batches])[:, 0].mean()
    seen = []
    table = hs.ablate(
        model,
        "0",
        batches,
        metric=lambda pred, y: seen.append(pred[:, 0].clone()) or 0.0,
        how="mean",
        per="unit",
    )
    assert len(table.rows) == 3
    ablated_unit0 = seen[len(batches)]  # after the baseline's batches, unit 0 is ablated first
    torch.testing.assert_close(ablated_unit0, mean_of_unit0.expand_as(ablated_unit0))


def test_digits_cnn_layers_matter_in_the_order_they_are_ablated() -> None:
    torch.manual_seed(0)
    model = digits_cnn()
    x, y, _, _ = digits_tensors()
    model.eval()  # BatchNorm with running statistics of a fresh model: the identity
    table = hs.ablate(model, nn.Conv2d, [(x[:256], y[:256])])
    assert len(table.rows) == 3
    effects = [abs(row.effect) for row in table.rows]
    assert effects == sorted(effects, reverse=True) and effects[0] > 0
