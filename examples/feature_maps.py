"""Look inside a ResNet34: capture the output of every Conv2d and draw the first conv's 64 feature maps.

The hookscope version of the classic "PyTorch hooks" example: no hook class, no handle list to forget,
results keyed by layer name. Random weights (nothing is downloaded), scikit-learn's bundled china.jpg.

    python examples/feature_maps.py --out runs/demo
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import nn
from torchvision.models import resnet34

import hookscope as hs
from hookscope.data.images import sample_image


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/feature_maps"), help="folder for the PNG")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = resnet34(weights=None).eval()
    image = sample_image(224)

    with torch.no_grad(), hs.capture(model, nn.Conv2d) as cap:
        model(image)

    for record in cap.records:
        print(f"{record.name:<24} {tuple(record.value.shape)}")
    print(f"{len(cap)} Conv2d outputs captured")

    fig = hs.viz.feature_maps(cap["conv1"], title="conv1: 64 feature maps")
    path = hs.viz.save_figure(fig, args.out / "conv1_feature_maps.png")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
