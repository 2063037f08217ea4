"""Running statistics of tensor streams, kept on the tensor's device and read back only on request.

Watching activations during training is only affordable when it never stalls the device: fastai's
ActivationStats calls ``.item()`` three times per layer per batch, a host sync each. Here every update is a
handful of device ops whose results stay on the device; :func:`read_stats` turns any number of snapshots
(many layers, many steps) into plain numbers with ONE device-to-host transfer.

What is kept for a stream of tensors ``x``:

- ``count`` values seen, ``mean`` and ``std`` over the finite values, ``abs_max`` of the finite values.
  Each tensor's sum (PyTorch's cascade summation) and sum of squares (norms of short rows) are taken in
  float32 with a relative error ~1e-7 and accumulated across tensors in float64;
- ``zero_fraction``: exact zeros among all values (what a ReLU produces; negatives are not "near zero");
- ``nonfinite``: NaN and +/-Inf values, counted exactly and left out of every other statistic, so one Inf
  does not silently turn the mean into NaN;
- a histogram over ``range`` with ``bins`` equal bins; values outside the range are clamped into the first
  or last bin, non-finite values are left out. It is the only sampled statistic: a tensor larger than
  ``sample`` values contributes an evenly strided sample of about ``sample`` of them (a histogram of every
  value costs ~10 ns per value on a CPU, more than the layer itself); smaller tensors count every value;
- ``channel_abs_max``: the max |x| per channel (dim 1) for tensors of two or more dimensions, so a channel
  whose max is 0 over a window is a dead unit.

Everything except the histogram is exact over every value. On a CPU, a tensor whose sum is finite (so
every value is) skips the non-finite handling, about half the work; see :func:`_batch_stats`.

Parameter gradients get :func:`grad_norms` (one fused norm over every parameter) and
:class:`UpdateRatio` (``||w_after - w_before|| / ||w_after||`` measured around ``opt.step()``).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar, overload

import numpy as np
import torch
from torch import nn

# Layout of the float64 "sums" vector of a snapshot: four scalars, then the histogram counts.
_SUM, _SUMSQ, _NONZERO, _NONFINITE = 0, 1, 2, 3
_HEAD = 4
# float32 sums of 0/1 indicators are exact up to 2**24 terms; larger tensors count in float64.
_EXACT_FLOAT32_COUNT = 2**24
_SAME_SIZE_INT = {torch.float32: torch.int32, torch.float64: torch.int64}
_NUMPY_FLOAT = {torch.float32: np.float32, torch.float64: np.float64}
_BINCOUNT_FROM = 4096
# The non-finite count of a tensor known to be finite (stack() promotes it with the other sums).
_NO_NONFINITE = torch.zeros(())
# Row length of the sum of squares: short enough for float32 accumulators to stay exact to ~1e-7.
_ROW = 4096

K = TypeVar("K")


@dataclass(frozen=True)
class TensorStats:
    """Statistics of every value a :class:`RunningStats` saw between two resets, as host values.

    ``histogram`` holds counts per bin (``edges`` has ``bins + 1`` entries) of the finite values, or of a
    strided sample of them for tensors larger than the accumulator's ``sample``.
    """

    count: int
    mean: float
    std: float
    abs_max: float
    zero_fraction: float
    nonfinite: int
    histogram: np.ndarray
    edges: np.ndarray
    channel_abs_max: np.ndarray

    @property
    def finite(self) -> int:
        """How many values were finite (the ones mean, std and histogram describe)."""
        return self.count - self.nonfinite

    def dead_fraction(self, threshold: float = 0.0) -> float:
        """Fraction of channels whose max |x| stayed at or below ``threshold`` (dead units).

        0.0 when the tensors had no channel dimension.
        """
        if self.channel_abs_max.size == 0:
            return 0.0
        return float(np.mean(self.channel_abs_max <= threshold))


@dataclass(frozen=True)
class DeviceStats:
    """A snapshot still on the device: what :func:`read_stats` turns into :class:`TensorStats`.

    ``sums`` is float64 ``[sum, sum of squares, non-zero finite count, non-finite count, histogram...]``,
    ``maxes`` the per-channel max |x| (or a single overall max when ``channels`` is False).
    """

    count: int
    sums: torch.Tensor
    maxes: torch.Tensor
    channels: bool
    bins: int
    range: tuple[float, float]


class RunningStats:
    """Accumulates statistics of every tensor passed to :meth:`update`, without a host sync.

    ``bins`` and ``range`` define the histogram (``range`` should include negatives for anything but
    post-ReLU activations). ``snapshot()`` hands the device-side state to :func:`read_stats`.
    """

    def __init__(self, bins: int = 40, range: tuple[float, float] = (-5.0, 5.0), sample: int = 16384) -> None:
        low, high = float(range[0]), float(range[1])
        if bins < 1 or not low < high or sample < 1:
            raise ValueError(
                f"RunningStats needs bins >= 1, range low < high and sample >= 1, got bins={bins}, "
                f"range={range}, sample={sample}; use e.g. bins=40, range=(-5.0, 5.0), sample=16384"
            )
        self.bins = bins
        self.range = (low, high)
        self.sample = sample
        self.reset()

    def reset(self) -> None:
        """Forget everything seen so far."""
        self.count = 0
        self._sums: torch.Tensor | None = None
        self._maxes: torch.Tensor | None = None
        self._channels = False

    def update(self, x: torch.Tensor) -> None:
        """Add every value of ``x`` (any shape, any float dtype) to the running statistics."""
        if x.numel() == 0:
            return
        sums, maxes, channels = _batch_stats(x.detach(), self.bins, self.range, self.sample)
        if self._sums is None or self._maxes is None:
            self._sums, self._maxes, self._channels = sums, maxes, channels
        else:
            self._check_same_channels(maxes, channels)
            self._sums = self._sums + sums
            self._maxes = torch.maximum(self._maxes, maxes)
        self.count += x.numel()

    def snapshot(self, reset: bool = False) -> DeviceStats | None:
        """The state so far as a :class:`DeviceStats` (None before any update); ``reset`` starts afresh.

        Cheap: no copy and no transfer, so a callback can take one per step and read them later in bulk.
        """
        if self._sums is None or self._maxes is None:
            return None
        snap = DeviceStats(self.count, self._sums, self._maxes, self._channels, self.bins, self.range)
        if reset:
            self.reset()
        return snap

    def read(self) -> TensorStats | None:
        """The statistics so far as host values (one transfer); None before any update."""
        snap = self.snapshot()
        return None if snap is None else read_stats([snap])[0]

    def _check_same_channels(self, maxes: torch.Tensor, channels: bool) -> None:
        assert self._maxes is not None
        if channels != self._channels or maxes.shape != self._maxes.shape:
            now = maxes.numel() if channels else "no"
            before = self._maxes.numel() if self._channels else "no"
            raise ValueError(
                f"RunningStats got a tensor with {now} channels (dim 1) after tensors with {before} "
                "channels; keep one RunningStats per stream of same-layout tensors"
            )


def _batch_stats(
    x: torch.Tensor, bins: int, hist_range: tuple[float, float], sample: int
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Device-side statistics of one tensor: (float64 sums vector, per-channel max |x|, has channels).

    Every op here is a vectorised pass with no data-dependent branch on the device: count_nonzero,
    isfinite().sum() and a full histc run 10-100x slower on CPU than the arithmetic used instead. A tensor
    whose sum is finite holds only finite values (one NaN or Inf makes any sum NaN or Inf), so on a CPU,
    where reading that sum costs no device sync, such a tensor skips the non-finite handling: four passes
    (sum, abs, norms of rows, amax) and a sign count instead of eleven.
    """
    if not x.is_floating_point() or x.element_size() < 4:
        x = x.float()  # integers, and half precision sums and histograms that lose too much
    count_dtype = torch.float64 if x.numel() > _EXACT_FLOAT32_COUNT else None
    magnitude, scratch = _SCRATCH.buffers(x)
    total = x.sum()
    finite = x.device.type == "cpu" and math.isfinite(total)
    if finite:
        nonfinite = _NO_NONFINITE
        torch.abs(x, out=magnitude)
    else:
        # x * 0 is 0 for a finite value and NaN for NaN or +/-Inf: turning NaN into 1 counts them.
        torch.mul(x, 0.0, out=scratch).nan_to_num_(nan=1.0)
        nonfinite = scratch.sum(dtype=count_dtype)
        torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0, out=magnitude)
        total = magnitude.sum()
        magnitude.abs_()
    histogram = _histogram(x, bins, hist_range, sample, finite)
    total_sq = _sum_of_squares(magnitude.view(-1))
    maxes, channels = _channel_max(magnitude)
    nonzero = magnitude.sign_().sum(dtype=count_dtype)
    head = torch.stack([total, total_sq, nonzero, nonfinite])  # promoted to float64 for huge tensors
    return torch.cat([head, histogram]).to(torch.float64), maxes, channels


def _channel_max(magnitude: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """Max per channel (dim 1) of finite values >= 0, or the overall max of a 1-d tensor.

    Reduced as integers: the bit patterns of non-negative floats sort like the floats, and an integer
    max vectorises better (no NaN propagation), 1.6x faster on CPU.
    """
    bits = magnitude.view(_SAME_SIZE_INT[magnitude.dtype])
    if magnitude.dim() >= 2:
        dims = [d for d in range(magnitude.dim()) if d != 1]
        return bits.amax(dim=dims).view(magnitude.dtype), True
    return bits.amax().reshape(1).view(magnitude.dtype), False


def _sum_of_squares(flat: torch.Tensor) -> torch.Tensor:
    """Sum of squares of a contiguous 1-d tensor, as exact as a cascade sum (relative error ~1e-7).

    One pass and no temporary: the norms of rows of ``_ROW`` values, then their dot product. A single
    norm or dot over a million values drifts by ~1e-5 (one float32 accumulator per SIMD lane).
    """
    rows = flat.numel() // _ROW
    if rows == 0:
        return torch.dot(flat, flat)
    norms = torch.linalg.vector_norm(flat[: rows * _ROW].view(rows, _ROW), dim=1)
    total = torch.dot(norms, norms)
    tail = flat[rows * _ROW :]
    return total + torch.dot(tail, tail) if tail.numel() else total


class _ScratchBuffers:
    """Two reusable CPU work buffers per thread and dtype, grown to the largest tensor seen.

    A statistics update needs one tensor-sized temporary, two for a tensor with non-finite values. On a
    CPU, allocating them fresh costs more than the arithmetic (each large allocation is new memory from
    the OS, page-faulted on first touch), so they are kept and reused; updates on a thread run one after
    another, so reuse is safe. The cost is two copies of the largest monitored tensor. Other devices
    allocate fresh buffers: their caching allocators already reuse memory, and GPU memory is too precious
    to hold.
    """

    def __init__(self) -> None:
        self._local = threading.local()

    def buffers(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Two tensors shaped like ``like`` (same dtype and device), contents undefined."""
        if like.device.type != "cpu":
            return torch.empty_like(like), torch.empty_like(like)
        pool: dict[torch.dtype, torch.Tensor] = self._local.__dict__.setdefault("pool", {})
        n = like.numel()
        flat = pool.get(like.dtype)
        if flat is None or flat.numel() < 2 * n:
            flat = pool[like.dtype] = torch.empty(2 * n, dtype=like.dtype)
        return flat[:n].view(like.shape), flat[n : 2 * n].view(like.shape)


_SCRATCH = _ScratchBuffers()


def _histogram(
    x: torch.Tensor, bins: int, hist_range: tuple[float, float], sample: int, finite: bool
) -> torch.Tensor:
    """Counts of the finite values of ``x`` (or of every ``stride``-th one), out-of-range clamped.

    ``finite`` says ``x`` is known to hold only finite values: the bins of a large sample are then
    computed with ``torch.histc``'s own arithmetic and counted with ``bincount``, 1.7x faster than
    ``histc`` on 16384 values (slower below ``_BINCOUNT_FROM``: more ops).
    """
    low, high = hist_range
    values = x.reshape(-1) if x.is_contiguous() else x.flatten()
    stride = _sample_stride(values.numel(), sample)
    if stride > 1:
        values = values[::stride]
    if not finite:  # histc skips NaN, so every non-finite value becomes NaN
        values = torch.nan_to_num(values, nan=math.nan, posinf=math.nan, neginf=math.nan)
    elif values.numel() >= _BINCOUNT_FROM:
        return _bincount_histogram(values, bins, low, high)
    # clamping keeps out-of-range values in the edge bins
    return torch.histc(torch.clamp(values, low, high), bins=bins, min=low, max=high)


def _bincount_histogram(values: torch.Tensor, bins: int, low: float, high: float) -> torch.Tensor:
    """What ``torch.histc(values.clamp(low, high), bins, low, high)`` returns, for finite values.

    Same arithmetic as histc, so values on a bin edge land in the same bin: the range rounded to the
    values' dtype, ``(v - low) * bins / (high - low)``, truncated; clamping the bin index instead of the
    values puts out-of-range values (and ``high`` itself) into the edge bins.
    """
    as_dtype = _NUMPY_FLOAT[values.dtype]
    lo = as_dtype(low)
    width = as_dtype(as_dtype(high) - lo)
    position = torch.sub(values, float(lo)).mul_(bins).div_(float(width)).clamp_(0, bins - 1)
    return torch.bincount(position.to(torch.int64), minlength=bins)


def _sample_stride(n: int, sample: int) -> int:
    """A prime stride giving about ``sample`` values of ``n``; prime so it does not follow a row length."""
    stride = -(-n // sample)
    while stride > 2 and any(stride % d == 0 for d in range(2, math.isqrt(stride) + 1)):
        stride += 1
    return stride


@overload
def read_stats(snapshots: Mapping[K, DeviceStats | RunningStats]) -> dict[K, TensorStats]: ...
@overload
def read_stats(snapshots: Sequence[DeviceStats | RunningStats]) -> list[TensorStats]: ...
def read_stats(
    snapshots: Mapping[K, DeviceStats | RunningStats] | Sequence[DeviceStats | RunningStats],
) -> dict[K, TensorStats] | list[TensorStats]:
    """Turn many device snapshots (or accumulators) into :class:`TensorStats` with one transfer per device.

    A mapping returns a dict with the same keys; a sequence returns a list in the same order. An
    accumulator that saw nothing yet raises, naming its key.
    """
    keys = list(snapshots.keys()) if isinstance(snapshots, Mapping) else None
    items = list(snapshots.values()) if isinstance(snapshots, Mapping) else list(snapshots)
    snaps = [_as_snapshot(item, keys[i] if keys is not None else i) for i, item in enumerate(items)]
    stats, _ = read_all(snaps)
    return dict(zip(keys, stats, strict=True)) if keys is not None else stats


def read_all(
    snapshots: Sequence[DeviceStats], tensors: Sequence[torch.Tensor] = ()
) -> tuple[list[TensorStats], list[np.ndarray]]:
    """Read snapshots AND any other device tensors (gradient norms, ratios...) in one transfer per device.

    Returns the :class:`TensorStats` of the snapshots and float64 arrays shaped like ``tensors``.
    """
    parts = [t for snap in snapshots for t in (snap.sums, snap.maxes)]
    host = to_host([*parts, *tensors])
    stats = [_to_tensor_stats(snap, host[2 * i], host[2 * i + 1]) for i, snap in enumerate(snapshots)]
    return stats, host[len(parts) :]


def _as_snapshot(item: DeviceStats | RunningStats, key: object) -> DeviceStats:
    if isinstance(item, DeviceStats):
        return item
    snap = item.snapshot()
    if snap is None:
        raise ValueError(f"read_stats: the RunningStats at {key!r} has seen no tensor yet; update it first")
    return snap


def _to_tensor_stats(snap: DeviceStats, sums: np.ndarray, maxes: np.ndarray) -> TensorStats:
    histogram = np.rint(sums[_HEAD:]).astype(np.int64)
    nonfinite = round(float(sums[_NONFINITE]))
    finite = snap.count - nonfinite
    mean = float(sums[_SUM]) / finite if finite else math.nan
    var = max(float(sums[_SUMSQ]) / finite - mean * mean, 0.0) if finite else math.nan
    return TensorStats(
        count=snap.count,
        mean=float(mean),
        std=math.sqrt(var),
        abs_max=float(maxes.max()) if finite else math.nan,
        zero_fraction=(finite - float(sums[_NONZERO])) / snap.count if snap.count else math.nan,
        nonfinite=nonfinite,
        histogram=histogram,
        edges=np.linspace(snap.range[0], snap.range[1], snap.bins + 1),
        channel_abs_max=maxes.astype(np.float64) if snap.channels else np.zeros(0),
    )


def to_host(tensors: Sequence[torch.Tensor]) -> list[np.ndarray]:
    """Copy many tensors to the host as float64 numpy arrays with one transfer per device.

    Each tensor is flattened, all of a device are concatenated on that device, copied once, and split
    back into arrays shaped like the inputs.
    """
    out: list[np.ndarray | None] = [None] * len(tensors)
    by_device: dict[torch.device, list[int]] = {}
    for i, t in enumerate(tensors):
        by_device.setdefault(t.device, []).append(i)
    for indices in by_device.values():
        flat = torch.cat([tensors[i].detach().reshape(-1).to(torch.float64) for i in indices]).cpu().numpy()
        offset = 0
        for i in indices:
            n = tensors[i].numel()
            out[i] = flat[offset : offset + n].reshape(tensors[i].shape)
            offset += n
    return [a for a in out if a is not None]


def grad_norms(params: Sequence[torch.Tensor]) -> torch.Tensor:
    """L2 norm of each parameter's ``.grad`` as one device vector (one fused op, no host sync).

    Every parameter must have a gradient; filter with ``p.grad is not None`` first (a host-side check).
    """
    missing = [i for i, p in enumerate(params) if p.grad is None]
    if missing:
        raise ValueError(
            f"grad_norms: parameters at positions {missing[:5]} have no .grad; pass only parameters "
            "with p.grad is not None"
        )
    if not params:
        return torch.zeros(0)
    grads = [p.grad for p in params if p.grad is not None]
    return torch.stack(torch._foreach_norm(grads)).to(torch.float32)


class UpdateRatio:
    """Measures ``||w_after - w_before|| / ||w_after||`` per parameter around an optimizer step.

    Call :meth:`before` just before ``opt.step()`` and :meth:`after` just after; ``after`` returns the
    ratios as one device vector in the order of ``params``. A healthy rate is around 1e-3.
    """

    def __init__(self, params: Sequence[nn.Parameter]) -> None:
        self.params = [p.detach() for p in params]
        self._before: list[torch.Tensor] = []
        self._armed = False

    def before(self) -> None:
        """Remember the current weights (copied into buffers reused from step to step)."""
        if not self.params:
            return
        if len(self._before) != len(self.params):
            self._before = [torch.empty_like(p) for p in self.params]
        torch._foreach_copy_(self._before, self.params)
        self._armed = True

    def after(self) -> torch.Tensor:
        """The update-to-weight ratio of each parameter since :meth:`before`, on the device."""
        if not self.params:
            return torch.zeros(0)
        if not self._armed:
            raise RuntimeError(
                "UpdateRatio.after() called without before(); call before() ahead of opt.step()"
            )
        self._armed = False
        torch._foreach_sub_(self._before, self.params)
        deltas = torch.stack(torch._foreach_norm(self._before))
        weights = torch.stack(torch._foreach_norm(self.params))
        return (deltas / weights.clamp_min(torch.finfo(weights.dtype).tiny)).to(torch.float32)
