import numpy as np
import pytest
import torch
from matplotlib.figure import Figure
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hookscope as hs
from hookscope.callbacks.layer_stats import ParamRecord, StepStats
from hookscope.hooks.select import leaves
from hookscope.hooks.stats import RunningStats


@pytest.fixture(scope="module")
def trained() -> tuple[hs.callbacks.ActivationStats, hs.callbacks.GradientStats]:
    torch.manual_seed(0)
    x, y = torch.randn(40, 1, 6, 6), torch.randint(0, 3, (40,))
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(144, 3))
    acts = hs.callbacks.ActivationStats(select=leaves, bins=16, range=(-2.0, 2.0))
    grads = hs.callbacks.GradientStats()
    dls = (DataLoader(TensorDataset(x, y), batch_size=8), None)
    hs.Learner(model, dls, nn.CrossEntropyLoss(), cbs=[acts, grads], progress=False).fit(2)
    return acts, grads


def test_colorful_dimension_is_one_histogram_column_per_step(trained):
    acts, _ = trained
    fig = hs.viz.colorful_dimension(acts, "1")
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    (image,) = ax.get_images()
    data = np.asarray(image.get_array())
    assert data.shape == (16, 10)  # bins x recorded steps
    want = np.log1p(np.stack([r.stats.histogram for r in acts.history["1"]], axis=1))
    np.testing.assert_allclose(data, want)
    assert image.get_extent() == pytest.approx([-0.5, 9.5, -2.0, 2.0])
    assert "1" in ax.get_title()


def test_colorful_dimension_accepts_a_plain_history_and_names_unknown_layers(trained):
    acts, _ = trained
    fig = hs.viz.colorful_dimension(acts.history, "0", log=False)
    data = np.asarray(fig.axes[0].get_images()[0].get_array())
    assert data.sum() == sum(r.stats.histogram.sum() for r in acts.history["0"])
    with pytest.raises(KeyError, match="no layer 'conv9'"):
        hs.viz.colorful_dimension(acts, "conv9")


def test_activation_curves_draw_mean_std_and_dead_fraction_per_layer(trained):
    acts, _ = trained
    fig = hs.viz.activation_curves(acts, layers=["0", "1"])
    ax_mean, ax_std, ax_dead = fig.axes[:3]
    assert [ax.get_ylabel() for ax in (ax_mean, ax_std, ax_dead)] == ["mean", "std", "dead fraction"]
    assert [line.get_label() for line in ax_mean.get_lines()] == ["0", "1"]
    steps, means = ax_mean.get_lines()[1].get_data()
    assert list(steps) == [r.step for r in acts.history["1"]]
    assert list(means) == pytest.approx([r.stats.mean for r in acts.history["1"]])


def test_activation_curves_show_a_dead_layer():
    history = {"relu": [StepStats(step, _stats(torch.zeros(4, 3, 2, 2))) for step in range(3)]}
    fig = hs.viz.activation_curves(history)
    _, dead = fig.axes[2].get_lines()[0].get_data()
    assert list(dead) == [1.0, 1.0, 1.0]


def test_gradient_flow_has_one_bar_per_layer_and_an_update_ratio_panel(trained):
    _, grads = trained
    fig = hs.viz.gradient_flow(grads)
    assert isinstance(fig, Figure)
    ax_norm, ax_ratio = fig.axes
    assert [t.get_text() for t in ax_ratio.get_xticklabels()] == ["0", "3"]
    assert len(ax_norm.patches) == 2
    records = grads.param_history
    last = [
        np.hypot(records[f"{layer}.weight"][-1].grad_norm, records[f"{layer}.bias"][-1].grad_norm)
        for layer in ("0", "3")
    ]
    dots = [line.get_ydata()[0] for line in ax_norm.get_lines()]
    assert dots == pytest.approx(last)
    assert ax_norm.get_yscale() == "log" and ax_ratio.get_ylabel() == "update / weight"


def test_gradient_flow_of_a_deep_model_has_one_bar_per_block():
    # GPT-2's layout: 12 blocks of 6 layers with parameters, and the embeddings and final norm around them
    sublayers = ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj")
    names = ["transformer.wte", *(f"transformer.h.{b}.{s}" for b in range(12) for s in sublayers)]
    history = {f"{name}.weight": [ParamRecord(0, 3.0, None)] for name in [*names, "transformer.ln_f"]}
    fig = hs.viz.gradient_flow(history)
    blocks = [f"transformer.h.{b}" for b in range(12)]
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert labels == ["transformer.wte", *blocks, "transformer.ln_f"]
    dots = [line.get_ydata()[0] for line in fig.axes[0].get_lines()]
    assert dots[1] == pytest.approx(3.0 * np.sqrt(6))  # a block's norm: its 6 layers' combined


def test_gradient_flow_marks_a_layer_without_gradient():
    history = {
        "used.weight": [ParamRecord(0, 0.5, None), ParamRecord(1, 0.25, None)],
        "unused.weight": [ParamRecord(0, None, None), ParamRecord(1, None, None)],
    }
    fig = hs.viz.gradient_flow(history)
    assert len(fig.axes) == 1  # no update ratios recorded: no second panel
    assert [t.get_text() for t in fig.axes[0].texts] == ["no grad"]


def test_gradient_flow_before_training_says_what_to_do():
    with pytest.raises(ValueError, match="GradientStats"):
        hs.viz.gradient_flow({"w": []})


def _stats(tensor: torch.Tensor):
    stats = RunningStats()
    stats.update(tensor)
    return stats.read()
