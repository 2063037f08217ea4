import torch
from torch import nn

import hookscope as hs
from hookscope.data.digits import digits_loaders, digits_tensors
from hookscope.models import digits_cnn, mlp


def test_digits_cnn_shapes_and_names():
    model = digits_cnn(num_classes=10)
    assert model(torch.zeros(4, 1, 8, 8)).shape == (4, 10)
    assert model(torch.zeros(2, 1, 32, 32)).shape == (2, 10)
    assert [name for name, _ in hs.select(model, nn.Conv2d)] == [
        "features.0.0",
        "features.1.0",
        "features.3.0",
    ]


def test_mlp_layers_and_flattening():
    model = mlp((64, 32, 10))
    assert model(torch.zeros(5, 1, 8, 8)).shape == (5, 10)
    linears = [m for _, m in hs.select(model, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(64, 32), (32, 10)]
    assert isinstance(list(model.children())[-1], nn.Linear)  # logits, no final ReLU
    assert mlp()(torch.zeros(3, 32)).shape == (3, 10)


def test_digits_cnn_learns_digits():
    torch.manual_seed(0)
    model = digits_cnn()
    train_dl, _ = digits_loaders(batch_size=64, seed=0)
    _, _, x_valid, y_valid = digits_tensors(seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(2):
        model.train()
        for xb, yb in train_dl:
            loss = nn.functional.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        accuracy = (model(x_valid).argmax(1) == y_valid).float().mean().item()
    assert accuracy > 0.9
