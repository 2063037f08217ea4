"""hs.compact: pruned channels removed physically, outputs as the masked model's, fewer MACs."""

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torchvision.models import resnet18

import hookscope as hs
from hookscope.models import digits_cnn
from hookscope.pruning.compact import GroupImportance
from hookscope.pruning.importance import activation_importance


def data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    return torch.randn(16, 1, 8, 8, generator=generator), torch.randint(0, 10, (16,), generator=generator)


@pytest.mark.parametrize("how", ["l1", "activation", "taylor"])
def test_compact_keeps_the_masked_models_outputs_with_fewer_macs(how: str) -> None:
    torch.manual_seed(0)
    model = digits_cnn().eval()
    x, y = data()
    hs.prune(model, nn.BatchNorm2d, 0.5, how, structured=True, data=[(x, y)], loss_func=F.cross_entropy)
    with torch.no_grad():
        masked = model(x)
    masked_macs = hs.summary(model, x).total_macs
    report = hs.compact(model, x)
    with torch.no_grad():
        torch.testing.assert_close(model(x), masked, rtol=1e-5, atol=1e-5)
    assert report.removed == {"features.0.1": 16, "features.1.1": 32, "features.3.1": 32}
    assert report.macs_before == masked_macs
    assert report.macs_after == hs.summary(model, x).total_macs < 0.3 * masked_macs
    assert [m.out_channels for m in model.modules() if isinstance(m, nn.Conv2d)] == [16, 32, 32]
    assert not any(name.endswith("_mask") for name in model.state_dict())


def test_compact_follows_a_residual_block_internal_channels() -> None:
    torch.manual_seed(0)
    model = resnet18(weights=None, num_classes=10).eval()
    x = torch.randn(2, 3, 32, 32)
    hs.prune(model, "layer*.*.bn1", 0.5, structured=True)
    with torch.no_grad():
        masked = model(x)
    report = hs.compact(model, x)
    with torch.no_grad():
        torch.testing.assert_close(model(x), masked, rtol=1e-4, atol=1e-4)
    assert model.layer1[0].conv1.out_channels == 32 and model.layer1[0].conv2.in_channels == 32
    assert report.macs_after < 0.6 * report.macs_before


def test_unstructured_masks_leave_nothing_to_compact() -> None:
    model = digits_cnn()
    hs.prune(model, "features.1.0", 0.2)  # 288 weights per channel: none loses all of them
    with pytest.raises(ValueError, match="structured=True"):
        hs.compact(model, data()[0])


def test_torch_pruning_meta_pruner_with_hookscopes_activation_importance() -> None:
    import torch_pruning as tp

    torch.manual_seed(0)
    model = digits_cnn().eval()
    x, y = data()
    first = model.features[0][0]
    scores = activation_importance(model, "features.0.0", [(x, y)])["features.0.0"]
    keep = scores.argsort(descending=True)[:16].sort().values
    kept_weights = first.weight.detach()[keep].clone()
    importance = GroupImportance(model, "activation", [(x, y)])
    pruner = tp.pruner.MetaPruner(
        model, x, importance=importance, pruning_ratio=0.5, ignored_layers=[model.head[2]]
    )
    pruner.step()
    assert [m.out_channels for m in model.modules() if isinstance(m, nn.Conv2d)] == [16, 32, 32]
    assert torch.equal(first.weight.detach(), kept_weights)  # the 16 channels of highest mean |activation|
