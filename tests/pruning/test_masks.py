"""hs.prune / hs.sparsity / hs.finalize_pruning: masks on torch.nn.utils.prune, per layer and global."""

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import hookscope as hs
from hookscope.models import digits_cnn


def small_cnn() -> nn.Sequential:
    torch.manual_seed(0)
    return digits_cnn()


def batch(n: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return torch.randn(n, 1, 8, 8, generator=generator), torch.randint(0, 10, (n,), generator=generator)


@pytest.mark.parametrize("how", ["l1", "random", "activation", "taylor"])
def test_pruned_weights_are_exactly_zero_and_get_no_gradient(how: str) -> None:
    model = small_cnn()
    x, y = batch()
    hs.prune(model, nn.Conv2d, 0.6, how, data=[(x, y)], loss_func=F.cross_entropy)
    conv = model.features[1][0]
    mask = conv.weight_mask
    assert torch.all(conv.weight[mask == 0] == 0)
    F.cross_entropy(model(x), y).backward()
    assert torch.all(conv.weight_orig.grad[mask == 0] == 0)
    assert conv.weight_orig.grad[mask == 1].abs().sum() > 0


@pytest.mark.parametrize("how", ["l1", "random", "activation", "taylor"])
def test_per_layer_amount_is_each_layers_sparsity(how: str) -> None:
    model = small_cnn()
    x, y = batch()
    table = hs.prune(model, nn.Conv2d, 0.5, how, data=[(x, y)], loss_func=F.cross_entropy)
    for row in table.rows:
        assert row.zeros == round(0.5 * row.numel)
    assert table.total == pytest.approx(0.5, abs=1e-3)


def test_global_amount_is_the_selections_sparsity_not_each_layers() -> None:
    model = small_cnn()
    table = hs.prune(model, (nn.Conv2d, nn.Linear), 0.8, scope="global")
    numel = sum(r.numel for r in table.rows)
    assert sum(r.zeros for r in table.rows) == round(0.8 * numel)
    per_layer = [r.sparsity for r in table.rows]
    assert max(per_layer) - min(per_layer) > 0.1  # magnitudes differ by layer, so does the sparsity


def test_structured_prunes_whole_channels_with_their_bias() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 3))
    hs.prune(model, "0", 0.25, structured=True)
    conv = model[0]
    dead = (conv.weight.reshape(8, -1) == 0).all(1)
    assert int(dead.sum()) == 2
    assert torch.all(conv.bias[dead] == 0) and torch.all(conv.bias[~dead] != 0)
    out = conv(torch.randn(2, 3, 9, 9))
    assert torch.all(out[:, dead] == 0)
    assert hs.sparsity(model, "0").rows[0].channels_pruned == 2


def test_structured_l1_removes_the_smallest_channels() -> None:
    conv = nn.Conv2d(1, 4, 1, bias=False)
    with torch.no_grad():
        conv.weight.copy_(torch.tensor([3.0, -1.0, 2.0, 0.5]).reshape(4, 1, 1, 1))
    model = nn.Sequential(conv, nn.ReLU())
    hs.prune(model, "0", 0.5, structured=True)
    assert conv.weight_mask.flatten().tolist() == [1.0, 0.0, 1.0, 0.0]


def test_rising_amounts_keep_what_was_pruned() -> None:
    model = small_cnn()
    hs.prune(model, nn.Conv2d, 0.3, "random")
    first = model.features[1][0].weight_mask.clone()
    hs.prune(model, nn.Conv2d, 0.6, "random")
    second = model.features[1][0].weight_mask
    assert torch.all(second[first == 0] == 0)
    assert hs.sparsity(model, "features.1.0")["features.1.0"] == pytest.approx(0.6, abs=1e-3)


def test_sparsity_table_and_finalize() -> None:
    model = small_cnn()
    hs.prune(model, nn.Conv2d, 0.5)
    table = hs.sparsity(model)
    assert [r.name for r in table.rows] == [
        "features.0.0",
        "features.0.1",
        "features.1.0",
        "features.1.1",
        "features.3.0",
        "features.3.1",
        "head.2",
    ]
    assert table["features.0.0"] == pytest.approx(0.5, abs=0.01)
    assert table["head.2"] == 0.0
    assert "total" in str(table)
    x, _ = batch()
    model.eval()
    before = model(x)
    assert hs.finalize_pruning(model) == 3
    assert not any(name.endswith(("_orig", "_mask")) for name in model.state_dict())
    assert torch.equal(model(x), before)
    assert hs.sparsity(model)["features.0.0"] == pytest.approx(0.5, abs=0.01)


def test_measuring_importance_leaves_grads_and_batchnorm_statistics_alone() -> None:
    model = small_cnn().train()
    x, y = batch()
    stats = model.features[0][1].running_mean.clone()
    hs.prune(model, nn.Conv2d, 0.5, "taylor", data=[(x, y)], loss_func=F.cross_entropy)
    assert model.training
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(model.features[0][1].running_mean, stats)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"amount": 1.5}, "amount=1.5 must be a fraction"),
        ({"amount": 0.5, "how": "activation"}, "needs data="),
        ({"amount": 0.5, "how": "taylor", "data": [batch()]}, "needs loss_func="),
        ({"amount": 0.5, "how": "magic"}, "how='magic' is not one of"),
        ({"amount": 0.5, "scope": "model"}, "scope='model'"),
    ],
)
def test_bad_arguments_are_one_clear_line(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        hs.prune(small_cnn(), nn.Conv2d, **kwargs)


def test_a_selection_without_weights_is_refused() -> None:
    with pytest.raises(ValueError, match="has a tensor 'weight'"):
        hs.prune(small_cnn(), nn.ReLU, 0.5)
