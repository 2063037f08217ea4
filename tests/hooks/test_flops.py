import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.flop_counter import FlopCounterMode

from hookscope.hooks.summary.flops import FlopCounter


def _both(fn) -> tuple[int, int]:
    with torch.no_grad(), FlopCounter() as ours:
        fn()
    with torch.no_grad(), FlopCounterMode(display=False) as theirs:
        fn()
    return ours.total(), theirs.get_total_flops()


def test_conv_linear_and_batched_matmul_match_flopcountermode():
    torch.manual_seed(0)
    conv, linear = nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.Linear(16, 4)
    x, h = torch.randn(2, 3, 16, 16), torch.randn(2, 5, 7, 16)
    a, b = torch.randn(3, 4, 6), torch.randn(3, 6, 5)
    ours, theirs = _both(lambda: (conv(x), linear(h), torch.bmm(a, b), a @ b))
    expected = 2 * (2 * 8 * 8 * 8 * 3 * 9 + 2 * 5 * 7 * 16 * 4 + 2 * 3 * 4 * 6 * 5)
    assert ours == theirs == expected


def test_cpu_attention_kernel_is_counted():
    q, k, v = torch.randn(2, 4, 10, 8), torch.randn(2, 4, 12, 8), torch.randn(2, 4, 12, 8)
    ours, theirs = _both(lambda: F.scaled_dot_product_attention(q, k, v))
    assert ours == 2 * (2 * 2 * 4 * 10 * 12 * 8)  # scores and weighted sum
    assert theirs == 0  # FlopCounterMode has no formula for the CPU flash kernel


def test_fast_path_is_switched_off_inside_and_restored_after_an_error():
    assert torch.backends.mha.get_fastpath_enabled()
    with pytest.raises(ValueError, match="boom"), FlopCounter():
        assert not torch.backends.mha.get_fastpath_enabled()
        raise ValueError("boom")
    assert torch.backends.mha.get_fastpath_enabled()
