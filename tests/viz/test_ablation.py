"""hs.viz.ablation_effects: one bar per ablation, largest effect on top."""

import pytest
import torch
from torch import nn

import hookscope as hs
from hookscope.hooks.ablate import Ablation


def test_one_bar_per_ablated_layer_largest_on_top(tmp_path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    x = torch.randn(32, 4)
    table = hs.ablate(model, ["0", "2"], [(x, model(x).argmax(1).detach())])
    fig = hs.viz.ablation_effects(table)
    ax = fig.axes[0]
    bars = ax.patches
    assert len(bars) == 2
    top = max(bars, key=lambda bar: bar.get_y())
    assert top.get_width() == pytest.approx(table.rows[0].effect)
    assert [t.get_text() for t in ax.get_yticklabels()] == [r.name for r in table.rows]  # listed top down
    assert "baseline cross_entropy" in ax.get_title()
    path = hs.viz.save_figure(fig, tmp_path / "ablation.png")
    assert path.stat().st_size > 0


def test_an_empty_ablation_is_refused() -> None:
    with pytest.raises(ValueError, match="no rows"):
        hs.viz.ablation_effects(Ablation(0.0, "zero", "layer", "loss"))
