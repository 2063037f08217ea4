"""hs.summary on every torchvision classification model at its default input size.

Models are built on the meta device (no memory, no weight init) and summarised there, which makes the whole
zoo cost seconds; the RegNets compute their widths with tensor ops at construction, so they are built on
CPU with ``torch.nn.init`` switched off (their weights are never read: initialising regnet_y_128gf's 644 M
took 12 s of the zoo's 80) and summarised with ``device="meta"``. Reference: torch's own
``FlopCounterMode`` on the same meta forward. On meta, attention runs its composed math (bmm), so both
counts agree; on CPU, FlopCounterMode counts zero for the fused multi-head-attention path and the CPU
flash-attention kernel that the ViTs take, where hs.summary counts them (the last test here).
"""

from unittest import mock

import pytest
import torch
import torchvision
from torch.utils.flop_counter import FlopCounterMode

import hookscope as hs

MODELS = torchvision.models.list_models(module=torchvision.models)

# Over about a second each on a loaded 2-core machine (big CPU builds or long meta forwards).
SLOW = {
    "convnext_large",
    "densenet161",
    "densenet201",
    "efficientnet_b7",
    "efficientnet_v2_l",
    "maxvit_t",
    "regnet_y_128gf",
    "swin_b",
    "swin_v2_b",
    "swin_v2_s",
    "vit_h_14",
    "vit_l_16",
    "vit_l_32",
}


ZOO = [pytest.param(name, marks=pytest.mark.slow) if name in SLOW else name for name in MODELS]


def _input_size(name: str) -> tuple[int, int, int, int]:
    """The smallest crop any of the model's published weights uses: what the weights=None model accepts."""
    side = min(w.transforms.keywords["crop_size"] for w in torchvision.models.get_model_weights(name))
    return (1, 3, side, side)


# What the RegNets' layers and their own init loop call: no-ops, so the weights stay uninitialised memory.
_INITS = ("uniform_", "normal_", "kaiming_uniform_", "kaiming_normal_", "zeros_", "ones_", "constant_")


def _build(name: str) -> torch.nn.Module:
    if name.startswith("regnet"):
        with mock.patch.multiple(torch.nn.init, **{init: lambda t, *a, **k: t for init in _INITS}):
            return torchvision.models.get_model(name, weights=None).eval()
    with torch.device("meta"):
        return torchvision.models.get_model(name, weights=None).eval()


def _flopcountermode_macs(model: torch.nn.Module, size: tuple[int, ...]) -> int:
    state = {name: t.to("meta") for name, t in [*model.named_parameters(), *model.named_buffers()]}
    x = torch.randn(size, device="meta")
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        torch.func.functional_call(model, state, (x,))
    return counter.get_total_flops() // 2


@pytest.mark.filterwarnings("ignore:The default weight initialization:FutureWarning")  # googlenet, inception
@pytest.mark.parametrize("name", ZOO)
def test_params_and_macs_match_torch(name):
    model = _build(name)
    size = _input_size(name)
    s = hs.summary(model, input_size=size, device="meta")
    unique = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    assert s.total_params == unique
    assert sum(row.params for row in s.rows) == unique
    reference = _flopcountermode_macs(model, size)
    assert abs(s.total_macs - reference) <= 0.02 * reference
    assert s.rows[0].input_shapes == [size]
    assert s.rows[0].output_shapes == [(1, 1000)]
    assert not any(row.failed for row in s.rows)


@pytest.mark.slow
def test_vit_on_cpu_counts_the_attention_flopcountermode_misses():
    torch.manual_seed(0)
    model = torchvision.models.vit_b_32(weights=None).eval()
    x = torch.randn(1, 3, 224, 224)
    on_cpu = hs.summary(model, x)
    on_meta = hs.summary(model, x, device="meta")
    with torch.no_grad(), FlopCounterMode(display=False) as raw:
        model(x)
    assert on_cpu.total_macs == on_meta.total_macs == _flopcountermode_macs(model, (1, 3, 224, 224))
    missed = 12 * (50 * 768 * 768 * 4 + 2 * 50 * 50 * 768)  # 12 blocks: q, k, v, out; scores and mix
    assert on_cpu.total_macs - raw.get_total_flops() // 2 == missed
