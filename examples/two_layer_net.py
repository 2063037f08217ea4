"""The seed article's TwoLayerNet, trained by the Learner instead of a hand-written loop.

Same problem as the article: N=64 random inputs of size D_in=1000, random targets of size D_out=10, a
hidden layer of H=100, ``MSELoss(reduction="sum")`` and Adam with lr 1e-4 for 500 steps (one batch of 64
per epoch). The article's loop body — forward, loss, zero_grad, backward, step — is the Learner's loop.

    python examples/two_layer_net.py
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hookscope as hs

N, D_in, H, D_out = 64, 1000, 100, 10


class TwoLayerNet(nn.Module):
    def __init__(self, D_in: int, H: int, D_out: int) -> None:
        super().__init__()
        self.linear1 = nn.Linear(D_in, H)
        self.linear2 = nn.Linear(H, D_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h_relu = self.linear1(x).clamp(min=0)
        return self.linear2(h_relu)


def main(steps: int = 500) -> hs.Learner:
    torch.manual_seed(0)
    x, y = torch.randn(N, D_in), torch.randn(N, D_out)
    dls = hs.DataLoaders(DataLoader(TensorDataset(x, y), batch_size=N))
    learn = hs.Learner(
        TwoLayerNet(D_in, H, D_out),
        dls,
        nn.MSELoss(reduction="sum"),
        opt_func=torch.optim.Adam,
        lr=1e-4,
        progress=False,
    )
    learn.fit(steps)
    losses = learn.recorder.losses
    for step in (0, 99, 199, 299, 399, steps - 1):
        if step < len(losses):
            print(f"step {step:>3}  loss {losses[step]:.6g}")
    print(f"loss fell {losses[0] / losses[-1]:.3g}x")
    return learn


if __name__ == "__main__":
    main()
