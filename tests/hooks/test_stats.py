import math

import numpy as np
import pytest
import torch
from torch import nn

from hookscope.hooks.stats import (
    DeviceStats,
    RunningStats,
    TensorStats,
    UpdateRatio,
    read_stats,
    to_host,
)


def direct(values: torch.Tensor, bins: int, low: float, high: float) -> dict:
    """The statistics computed the obvious way, in float64, on all values at once."""
    flat = values.detach().double().reshape(-1)
    finite = flat[torch.isfinite(flat)]
    return {
        "count": flat.numel(),
        "mean": finite.mean().item(),
        "std": finite.std(unbiased=False).item(),
        "abs_max": finite.abs().max().item(),
        "zero_fraction": (flat == 0).double().mean().item(),
        "nonfinite": int((~torch.isfinite(flat)).sum()),
        "histogram": torch.histc(finite.clamp(low, high), bins=bins, min=low, max=high).long().numpy(),
    }


def test_stats_equal_a_direct_computation_over_several_updates():
    torch.manual_seed(0)
    batches = [
        torch.randn(8, 3, 5, 5) * 2 + 0.5,
        torch.relu(torch.randn(4, 3, 5, 5)),
        torch.randn(2, 3, 5, 5),
    ]
    stats = RunningStats(bins=12, range=(-3.0, 3.0))
    for batch in batches:
        stats.update(batch)
    got = stats.read()
    want = direct(torch.cat(batches), 12, -3.0, 3.0)
    assert isinstance(got, TensorStats)
    assert got.count == want["count"]
    assert got.mean == pytest.approx(want["mean"], rel=1e-6)
    assert got.std == pytest.approx(want["std"], rel=1e-6)
    assert got.abs_max == pytest.approx(want["abs_max"], rel=1e-6)
    assert got.zero_fraction == pytest.approx(want["zero_fraction"])
    assert got.nonfinite == 0
    np.testing.assert_array_equal(got.histogram, want["histogram"])
    np.testing.assert_allclose(got.edges, np.linspace(-3.0, 3.0, 13))


def test_histogram_counts_negatives_and_clamps_out_of_range_values_into_edge_bins():
    x = torch.tensor([-10.0, -1.5, -0.5, 0.0, 0.5, 1.5, 10.0, 2.0, -2.0])
    stats = RunningStats(bins=4, range=(-2.0, 2.0))
    stats.update(x)
    got = stats.read()
    # bins: [-2,-1) [-1,0) [0,1) [1,2]; -10 and 10 are clamped into the edge bins.
    np.testing.assert_array_equal(got.histogram, [3, 1, 2, 3])
    assert got.histogram.sum() == x.numel()


def test_nonfinite_values_are_counted_and_left_out_of_the_moments():
    x = torch.tensor([[1.0, 2.0, float("nan")], [3.0, float("inf"), -float("inf")]])
    stats = RunningStats(bins=4, range=(0.0, 4.0))
    stats.update(x)
    got = stats.read()
    assert got.nonfinite == 3
    assert got.finite == 3
    assert got.mean == pytest.approx(2.0)
    assert got.std == pytest.approx(math.sqrt(2 / 3))
    assert got.abs_max == pytest.approx(3.0)
    assert got.histogram.sum() == 3
    # columns are the channels of a 2-d tensor; non-finite values count as 0 in the channel RMS
    np.testing.assert_allclose(got.channel_rms, [math.sqrt(5.0), math.sqrt(2.0), 0.0])


def test_a_large_tensor_has_exact_moments_and_counts_and_a_sampled_histogram():
    torch.manual_seed(0)
    x = torch.relu(torch.randn(32, 8, 30, 30))
    x[3, 2, 5, 7], x[10, 1, 0, 0], x[31, 7, 29, 29] = float("nan"), float("inf"), -float("inf")
    stats = RunningStats(bins=8, range=(0.0, 4.0), sample=5000)
    stats.update(x)
    got, want = stats.read(), direct(x, 8, 0.0, 4.0)
    assert (got.count, got.nonfinite) == (want["count"], 3)
    assert got.mean == pytest.approx(want["mean"], rel=1e-6)
    assert got.std == pytest.approx(want["std"], rel=1e-6)
    # 78 runs of 64 values; zeros, max and histogram describe them and match the whole tensor closely
    assert got.sampled == 78 * 64
    assert got.zero_fraction == pytest.approx(want["zero_fraction"], abs=0.03)
    finite = x[torch.isfinite(x)]
    assert torch.quantile(finite[::7], 0.99).item() <= got.abs_max <= want["abs_max"]
    assert got.histogram.sum() == got.sampled
    shares, want_shares = got.histogram / got.histogram.sum(), want["histogram"] / want["histogram"].sum()
    assert np.abs(shares - want_shares).max() < 0.03


def test_sample_none_makes_every_statistic_exact_in_a_large_tensor():
    torch.manual_seed(0)
    x = torch.relu(torch.randn(16, 8, 40, 40))
    x[0, 0, 0, 0] = 7.5  # a maximum that a sample would most likely miss
    stats = RunningStats(bins=8, range=(0.0, 4.0), sample=None)
    stats.update(x)
    got, want = stats.read(), direct(x, 8, 0.0, 4.0)
    assert got.sampled == got.count == x.numel()
    assert (got.abs_max, got.zero_fraction) == (7.5, want["zero_fraction"])
    np.testing.assert_array_equal(got.histogram, want["histogram"])


def test_the_sample_reaches_every_channel_and_batch_item():
    # each value names its (item, channel); runs spaced by a prime land on all of them
    items, channels = torch.meshgrid(torch.arange(64.0), torch.arange(16.0), indexing="ij")
    x = (items * 16 + channels)[:, :, None, None].expand(64, 16, 28, 28).contiguous()
    stats = RunningStats(bins=16, range=(0.0, 16.0))
    stats.update(x % 16)  # channel index
    per_channel = stats.read().histogram
    assert per_channel.min() >= 0.5 * per_channel.mean()
    items_seen = RunningStats(bins=64, range=(0.0, 64.0))
    items_seen.update(x // 16)  # batch item
    assert (items_seen.read().histogram > 0).sum() >= 16


def test_the_sample_is_a_copy_so_a_later_in_place_op_does_not_change_it():
    torch.manual_seed(0)
    x = torch.randn(64, 16, 28, 28)
    stats = RunningStats(bins=4, range=(-2.0, 2.0))
    stats.update(x)
    x.relu_()
    got = stats.read()
    assert got.zero_fraction == 0.0
    assert got.histogram[:2].sum() > 0.4 * got.sampled  # the negatives are still there


def test_a_large_batch_of_many_channels_keeps_one_norm_per_channel_and_stays_exact():
    torch.manual_seed(0)
    x = torch.randn(64, 128, 3, 3) * 2 + 0.5  # 8192 planes
    x[:, 5] = 0.0
    stats = RunningStats()
    stats.update(x)
    # what waits on the device for the read is one norm per channel, not one per plane
    assert stats.snapshot().updates[0].norms.numel() == 128
    got, want = stats.read(), direct(x, 40, -5.0, 5.0)
    assert got.std == pytest.approx(want["std"], rel=1e-6)
    np.testing.assert_allclose(
        got.channel_rms, x.double().pow(2).mean(dim=(0, 2, 3)).sqrt().numpy(), rtol=1e-6
    )
    assert got.dead_fraction() == 1 / 128


def test_a_long_window_folds_its_updates_and_stays_exact():
    torch.manual_seed(0)
    batches = [torch.randn(4, 3, 5) * (1 + i % 3) for i in range(75)]
    batches[40][1, 1, 1] = float("nan")
    stats = RunningStats(bins=10, range=(-4.0, 4.0))
    for batch in batches:
        stats.update(batch)
    got, want = stats.read(), direct(torch.cat(batches), 10, -4.0, 4.0)
    assert (got.count, got.nonfinite, got.sampled) == (want["count"], 1, want["count"])
    assert got.mean == pytest.approx(want["mean"], rel=1e-6)
    assert got.std == pytest.approx(want["std"], rel=1e-6)
    assert got.abs_max == pytest.approx(want["abs_max"])
    np.testing.assert_array_equal(got.histogram, want["histogram"])
    rms = torch.cat(batches).nan_to_num(0.0).double().pow(2).mean(dim=(0, 2)).sqrt().numpy()
    np.testing.assert_allclose(got.channel_rms, rms, rtol=1e-6)


def test_a_large_finite_tensor_gets_exact_moments_and_counts():
    torch.manual_seed(0)
    x = torch.randn(3, 7, 50_021) * 3 + 1  # not a multiple of any row length: exercises the tail
    x[x.abs() < 0.5] = 0.0
    stats = RunningStats(bins=10, range=(-10.0, 10.0), sample=10**7)
    stats.update(x)
    got, want = stats.read(), direct(x, 10, -10.0, 10.0)
    assert got.nonfinite == 0
    assert got.zero_fraction == want["zero_fraction"]
    assert got.mean == pytest.approx(want["mean"], rel=1e-6)
    assert got.std == pytest.approx(want["std"], rel=1e-6)
    assert got.abs_max == want["abs_max"]
    np.testing.assert_array_equal(got.histogram, want["histogram"])
    rms = x.double().pow(2).mean(dim=(0, 2)).sqrt().numpy()
    np.testing.assert_allclose(got.channel_rms, rms, rtol=1e-6)


def test_values_on_bin_edges_land_where_histc_puts_them_in_a_large_tensor():
    torch.manual_seed(0)
    edges = torch.linspace(-1.3, 2.9, 38)
    near = [edges, torch.nextafter(edges, torch.tensor(-9.0)), torch.nextafter(edges, torch.tensor(9.0))]
    x = torch.cat([*near, torch.randn(20_000) * 2]).reshape(2, -1)
    stats = RunningStats(bins=37, range=(-1.3, 2.9), sample=10**6)
    stats.update(x)
    want = torch.histc(x.clamp(-1.3, 2.9), bins=37, min=-1.3, max=2.9)
    np.testing.assert_array_equal(stats.read().histogram, want.long().numpy())


def test_finite_and_nonfinite_batches_mix_in_one_window():
    torch.manual_seed(0)
    clean, dirty = torch.randn(4, 3, 10), torch.randn(4, 3, 10)
    dirty[1, 2, 3], dirty[0, 0, 0] = float("nan"), float("inf")
    stats = RunningStats(bins=6, range=(-3.0, 3.0))
    for batch in (clean, dirty, clean):
        stats.update(batch)
    got, want = stats.read(), direct(torch.cat([clean, dirty, clean]), 6, -3.0, 3.0)
    assert (got.count, got.nonfinite) == (want["count"], 2)
    assert got.mean == pytest.approx(want["mean"], rel=1e-6)
    assert got.std == pytest.approx(want["std"], rel=1e-6)
    assert got.abs_max == pytest.approx(want["abs_max"])
    np.testing.assert_array_equal(got.histogram, want["histogram"])


def test_finite_values_whose_sum_overflows_are_not_counted_as_nonfinite():
    x = torch.tensor([3e38, 3e38, 0.0, -1.0])
    stats = RunningStats(bins=4, range=(-2.0, 2.0))
    stats.update(x)
    got = stats.read()
    assert got.nonfinite == 0
    assert got.zero_fraction == 0.25
    assert got.abs_max == pytest.approx(3e38)
    assert got.histogram.sum() == 4


def test_counts_stay_exact_beyond_float32_integer_precision():
    x = torch.zeros(2**24 + 5)
    x[:7] = 1.0
    x[-1] = float("nan")
    stats = RunningStats(sample=64)
    stats.update(x)
    got = stats.read()
    assert got.nonfinite == 1
    assert got.mean == 7 / (x.numel() - 1)


def test_all_nonfinite_gives_nan_moments_not_an_error():
    stats = RunningStats()
    stats.update(torch.full((3, 2), float("nan")))
    got = stats.read()
    assert got.nonfinite == 6
    assert math.isnan(got.mean) and math.isnan(got.std) and math.isnan(got.abs_max)


def test_per_channel_rms_finds_dead_units():
    x = torch.randn(16, 6, 4, 4).abs() + 0.1
    x[:, [1, 4]] = 0.0
    stats = RunningStats()
    stats.update(torch.relu(x))
    got = stats.read()
    assert got.channel_rms.shape == (6,)
    assert got.channel_rms[1] == 0.0 and got.channel_rms[4] == 0.0
    assert got.channel_rms[0] == pytest.approx(x[:, 0].double().pow(2).mean().sqrt().item(), rel=1e-6)
    assert got.dead_fraction() == pytest.approx(2 / 6)
    assert got.zero_fraction == pytest.approx(2 / 6)


def test_non_contiguous_tensors_give_the_same_statistics():
    torch.manual_seed(0)
    x = torch.randn(6, 5, 4, 3)
    plain, strided = RunningStats(bins=8, range=(-2.0, 2.0)), RunningStats(bins=8, range=(-2.0, 2.0))
    plain.update(x)
    strided.update(x.contiguous(memory_format=torch.channels_last))
    a, b = plain.read(), strided.read()
    assert (a.count, a.nonfinite, a.zero_fraction) == (b.count, b.nonfinite, b.zero_fraction)
    assert a.mean == pytest.approx(b.mean, rel=1e-6) and a.std == pytest.approx(b.std, rel=1e-6)
    np.testing.assert_array_equal(a.histogram, b.histogram)
    np.testing.assert_allclose(a.channel_rms, b.channel_rms, rtol=1e-6)


def test_one_dimensional_tensors_have_no_channels():
    stats = RunningStats()
    stats.update(torch.tensor([-3.0, 1.0]))
    got = stats.read()
    assert got.channel_rms.size == 0
    assert got.dead_fraction() == 0.0
    assert got.abs_max == 3.0


def test_half_precision_input_is_accumulated_in_float64():
    x = torch.randn(64, 8, dtype=torch.bfloat16)
    stats = RunningStats()
    stats.update(x)
    assert stats.read().mean == pytest.approx(x.double().mean().item(), rel=1e-6, abs=1e-9)


def test_snapshot_reset_starts_a_new_window_and_empty_stats_read_as_none():
    stats = RunningStats()
    assert stats.read() is None
    stats.update(torch.ones(4))
    snap = stats.snapshot(reset=True)
    assert isinstance(snap, DeviceStats)
    assert stats.snapshot() is None
    stats.update(torch.full((2,), 3.0))
    first, second = read_stats([snap, stats.snapshot()])
    assert (first.count, first.mean) == (4, 1.0)
    assert (second.count, second.mean) == (2, 3.0)


def test_read_stats_keeps_mapping_keys_and_names_an_empty_accumulator():
    a, b = RunningStats(), RunningStats()
    a.update(torch.ones(3))
    b.update(-torch.ones(3))
    got = read_stats({"conv1": a, "conv2": b})
    assert list(got) == ["conv1", "conv2"]
    assert got["conv2"].mean == -1.0
    with pytest.raises(ValueError, match="'fc'"):
        read_stats({"fc": RunningStats()})


def test_channel_count_must_not_change():
    stats = RunningStats()
    stats.update(torch.ones(2, 3, 4))
    with pytest.raises(ValueError, match="4 channels"):
        stats.update(torch.ones(2, 4, 4))


def test_a_stream_that_may_mix_layouts_keeps_its_first():
    stats = RunningStats()
    assert stats.update_if_same_layout(torch.ones(2, 3, 4))
    assert not stats.update_if_same_layout(torch.zeros(2, 4, 4))  # left out, not an error
    assert stats.update_if_same_layout(torch.full((1, 3, 4), 3.0))
    assert stats.count == 2 * 3 * 4 + 3 * 4 and stats.read().abs_max == 3.0


def test_bad_histogram_settings_are_refused():
    with pytest.raises(ValueError, match="range"):
        RunningStats(bins=10, range=(1.0, 1.0))


def test_to_host_returns_arrays_shaped_like_the_inputs():
    a, b = torch.arange(6.0).reshape(2, 3), torch.tensor(7, dtype=torch.int64)
    host_a, host_b = to_host([a, b])
    np.testing.assert_array_equal(host_a, a.numpy())
    assert host_b.shape == () and host_b == 7


def test_to_host_copies_float64_arrays_of_every_dtype_that_later_writes_leave_alone():
    ring = torch.arange(6, dtype=torch.float64).reshape(2, 3)  # a buffer written again after the read
    tensors = [ring, torch.tensor([1.5, -2.0], dtype=torch.bfloat16), torch.tensor([True, False])]
    tensors.append(torch.ones(2, requires_grad=True) * 3)
    host = to_host(tensors)
    ring.add_(10)
    assert all(a.dtype == np.float64 for a in host)
    assert host[0].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert [a.tolist() for a in host[1:]] == [[1.5, -2.0], [1.0, 0.0], [3.0, 3.0]]


def test_update_ratio_is_update_norm_over_weight_norm():
    layer = nn.Linear(4, 4)
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    layer(torch.randn(3, 4)).sum().backward()
    before = [p.detach().clone() for p in layer.parameters()]
    tracker = UpdateRatio(list(layer.parameters()))
    tracker.before()
    opt.step()
    got = tracker.after()
    want = torch.stack(
        [(p.detach() - b).norm() / p.detach().norm() for p, b in zip(layer.parameters(), before, strict=True)]
    )
    torch.testing.assert_close(got, want)
    with pytest.raises(RuntimeError, match="before"):
        tracker.after()
