"""Running statistics of tensor streams, kept on the tensor's device and read back only on request.

Watching activations during training is only affordable when it never stalls the device and costs little
next to the layer itself: fastai's ActivationStats calls ``.item()`` three times per layer per batch (a
host sync each). Here an update reads the tensor twice and copies a small sample, all on the device;
everything else is computed later, for many layers and steps at once, by :func:`read_stats`, which also
turns the results into plain numbers with ONE device-to-host transfer.

What is kept for a stream of tensors ``x``:

- exact, over every value: ``count``; ``mean`` and ``std`` of the finite values (each tensor's sum is a
  float32 cascade sum, its sum of squares comes from norms of rows of at most one channel plane, both
  ~1e-7 relative, accumulated in float64); ``nonfinite``, the NaN and +/-Inf values, counted exactly and
  left out of every other statistic; ``channel_rms``, the root mean square of each channel (dim 1) of
  tensors with two or more dims, so a channel that stayed exactly 0 (a dead unit) has ``channel_rms`` 0;
- sampled, from at most ``sample`` values per tensor (every value of a smaller tensor): ``abs_max``,
  ``zero_fraction`` and the ``histogram`` over ``range`` (``bins`` equal bins; out-of-range values are
  clamped into the edge bins). The sample is ``sample // 64`` runs of 64 consecutive values spread evenly
  over the tensor with a prime spacing (so it does not line up with rows or channels); runs keep the
  copy cheap. ``TensorStats.sampled`` says how many values these three describe.

Why sample those three: exact versions cost a full pass each (a per-channel max or a zero count is
slower than the sum on a CPU), and in a small CNN every pass over a conv output costs ~1-2% of the step.
``sample=None`` makes every statistic exact at that price.

Parameter gradients get :func:`whole_norms` (one fused norm over every tensor) and :class:`UpdateRatio`
(``||w_after - w_before|| / ||w_after||`` measured around ``opt.step()``). Both read sharded parameters and
gradients (``DTensor``: FSDP2's ``fully_shard``) as the whole tensor: each rank measures its shard and the
squares are added across the shard group — never gathering the tensor.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, TypeVar, overload

import numpy as np
import torch
from torch import nn

from hookscope import compat

_NUMPY_FLOAT = {torch.float32: np.float32, torch.float64: np.float64}
# Sample runs: consecutive values per run (256 bytes of float32), and updates kept raw per window.
_RUN = 64
_MAX_RAW_UPDATES = 32
# Row length of 1-d tensors' norms: short enough for float32 accumulators to stay exact to ~1e-7.
_ROW = 4096

K = TypeVar("K")


@dataclass(frozen=True)
class TensorStats:
    """Statistics of every value a :class:`RunningStats` saw between two resets, as host values.

    ``abs_max``, ``zero_fraction`` and ``histogram`` describe ``sampled`` of the ``count`` values (all of
    them when each tensor had at most the accumulator's ``sample`` values); everything else is exact.
    """

    count: int
    mean: float
    std: float
    abs_max: float
    zero_fraction: float
    nonfinite: int
    histogram: np.ndarray
    edges: np.ndarray
    channel_rms: np.ndarray
    sampled: int

    @property
    def finite(self) -> int:
        """How many values were finite (the ones mean and std describe)."""
        return self.count - self.nonfinite

    def dead_fraction(self, threshold: float = 0.0) -> float:
        """Fraction of channels whose root mean square stayed at or below ``threshold`` (dead units).

        With the default 0 that is channels whose every finite value was exactly 0 (or below ~1e-19 in
        magnitude, whose square underflows). 0.0 when the tensors had no channel dimension.
        """
        if self.channel_rms.size == 0:
            return 0.0
        return float(np.mean(self.channel_rms <= threshold))


class _Update(NamedTuple):
    """What one tensor leaves on the device: two reductions and a sample, all its statistics need.

    ``norms`` holds L2 norms of the finite values, flat, laid out as ``(rows, channels)``: one row per
    batch item (or a single row, see :func:`_norms`) for tensors with channels, a single channel
    otherwise. ``nonfinite`` is None when the tensor is known to be finite (no count was taken).
    ``sample`` may have any shape.
    """

    total: torch.Tensor
    norms: torch.Tensor
    channels: int
    nonfinite: torch.Tensor | None
    sample: torch.Tensor


@dataclass(frozen=True)
class _Rows:
    """Updates of one layout reduced on the device: one row per update, or one for a folded window.

    ``head`` is float64 ``[sum, non-finite count, zeros in the sample, non-finite values in the sample]``
    per row, ``histogram`` float64 counts of the finite sampled values, ``abs_max`` the largest finite
    sampled |x|, ``channel_sq`` the float64 sum of squares per channel, ``sampled`` the number of
    sampled values behind each row.
    """

    head: torch.Tensor
    histogram: torch.Tensor
    abs_max: torch.Tensor
    channel_sq: torch.Tensor
    sampled: list[int]

    def tensors(self) -> list[torch.Tensor]:
        return [self.head, self.histogram, self.abs_max, self.channel_sq]


@dataclass(frozen=True)
class DeviceStats:
    """A snapshot still on the device: what :func:`read_stats` turns into :class:`TensorStats`.

    Holds the window's raw updates (and, for windows longer than 32 updates, the reduction of the
    earlier ones); taking it costs nothing, so a callback can take one per step and read them in bulk.
    """

    count: int
    channels: bool
    bins: int
    range: tuple[float, float]
    updates: tuple[_Update, ...]
    folded: _Rows | None


class RunningStats:
    """Accumulates statistics of every tensor passed to :meth:`update`, without a host sync.

    ``bins`` and ``range`` define the histogram (``range`` should include negatives for anything but
    post-ReLU activations); ``sample`` caps the values per tensor behind ``abs_max``, ``zero_fraction``
    and the histogram (None: every value, at the cost of extra passes). ``snapshot()`` hands the
    device-side state to :func:`read_stats`.
    """

    def __init__(
        self, bins: int = 40, range: tuple[float, float] = (-5.0, 5.0), sample: int | None = 2048
    ) -> None:
        low, high = float(range[0]), float(range[1])
        if bins < 1 or not low < high or (sample is not None and sample < 1):
            raise ValueError(
                f"RunningStats needs bins >= 1, range low < high and sample >= 1 (or None), got bins={bins}, "
                f"range={range}, sample={sample}; use e.g. bins=40, range=(-5.0, 5.0), sample=2048"
            )
        self.bins = bins
        self.range = (low, high)
        self.sample = sample
        self.reset()

    def reset(self) -> None:
        """Forget everything seen so far."""
        self.count = 0
        self._updates: list[_Update] = []
        self._folded: _Rows | None = None
        self._channels: int | None = None  # dim 1 of the tensors, 0 for tensors of fewer than 2 dims

    def update(self, x: torch.Tensor) -> None:
        """Add every value of ``x`` (any shape, any float dtype) to the running statistics."""
        if x.numel() == 0:
            return
        channels = x.shape[1] if x.dim() >= 2 else 0
        if channels != self._channels:
            self._set_channels(channels)
        self._updates.append(_update_of(x.detach(), self.sample, max(channels, 1)))
        self.count += x.numel()
        # without a sample limit an update holds a copy of the whole tensor: reduce it at once
        if self.sample is None or len(self._updates) >= _MAX_RAW_UPDATES:
            self._folded = _fold(self._folded, self._updates, self.bins, self.range)
            self._updates = []

    def update_if_same_layout(self, x: torch.Tensor) -> bool:
        """:meth:`update` with ``x`` when it has the channel count (dim 1) of the tensors seen so far (or
        is the first); False, with ``x`` left out, when it has another. For a stream that may mix layouts
        without that being a mistake: a module called more than once a step (one ``nn.ReLU`` shared by
        layers of 64 and 32 channels, two sentences of different lengths through one encoder)."""
        if self._channels is not None and (x.shape[1] if x.dim() >= 2 else 0) != self._channels:
            return False
        self.update(x)
        return True

    def snapshot(self, reset: bool = False) -> DeviceStats | None:
        """The state so far as a :class:`DeviceStats` (None before any update); ``reset`` starts afresh.

        Cheap: no copy and no transfer, so a callback can take one per step and read them later in bulk.
        """
        if self._channels is None:
            return None
        channels = self._channels > 0
        snap = DeviceStats(self.count, channels, self.bins, self.range, tuple(self._updates), self._folded)
        if reset:
            self.reset()
        return snap

    def read(self) -> TensorStats | None:
        """The statistics so far as host values (one transfer); None before any update."""
        snap = self.snapshot()
        return None if snap is None else read_stats([snap])[0]

    def _set_channels(self, channels: int) -> None:
        """Remember the first tensor's channel count; refuse a different one later."""
        if self._channels is None:
            self._channels = channels
            return
        now, before = channels or "no", self._channels or "no"
        raise ValueError(
            f"RunningStats got a tensor with {now} channels (dim 1) after tensors with {before} "
            "channels; keep one RunningStats per stream of same-layout tensors"
        )


def _update_of(x: torch.Tensor, sample: int | None, channels: int) -> _Update:
    """The device-side reductions of one tensor, without a host sync on accelerators.

    A tensor whose sum is finite holds only finite values (one NaN or Inf makes any sum NaN or Inf), so
    on a CPU, where reading that sum is a memory read, such a tensor needs just the sum, the row norms and
    the sample. Other tensors, and every tensor on other devices, take the branch-free path that counts
    non-finite values and leaves them out of the sum and norms. Each op call counts: in a training step
    an update's small ops cost as much as its passes over the values, so there are as few as possible.
    """
    if not x.is_floating_point() or x.element_size() < 4:
        x = x.float()  # integers, and half precision sums that lose too much
    if not x.is_contiguous():
        x = x.contiguous()
    values = _sample(x, sample)
    if x.device.type == "cpu":
        total = x.sum()
        if math.isfinite(total):
            return _Update(total, _norms(x), channels, None, values)
    clean = torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)
    # a value differs from its cleaned copy exactly when it is NaN or +/-Inf (NaN differs from everything)
    nonfinite = torch.ne(x, clean).sum(dtype=torch.float64)
    return _Update(clean.sum(), _norms(clean), channels, nonfinite, values)


def _norms(x: torch.Tensor) -> torch.Tensor:
    """L2 norms of a contiguous tensor, flat, whose squares sum to the exact total sum of squares.

    Tensors with channels (dim 1) give one norm per batch item and channel, or per channel when there are
    more than 4096 of those (a 2-d tensor one per column); others one norm per run of at most 4096
    values. Short rows keep the float32 accumulators exact to ~1e-7, where a single norm over a million
    values drifts by ~1e-5.
    """
    if x.dim() >= 3:
        items, channels = x.shape[0], x.shape[1]
        planes = torch.linalg.vector_norm(x.view(items * channels, -1), dim=1)
        if items * channels <= _ROW:
            return planes
        # many planes (a large batch of many channels): keep one norm per channel, so that the updates
        # waiting to be read stay small; the per-channel sums of squares stay float32-exact (~1e-7)
        return planes.square_().view(items, channels).sum(0).sqrt_()
    if x.dim() == 2:
        # per column: vector_norm(x, dim=0) reduces across rows with strided reads, 6-13x slower on a CPU
        # for (64, 1568) or (512, 768); both overflow alike (no scaling) and agree to ~1e-7
        return x.square().sum(0).sqrt_()
    flat = x.view(-1)
    whole = flat.numel() - flat.numel() % _ROW
    rows = torch.linalg.vector_norm(flat[:whole].view(-1, _ROW), dim=1)
    if whole == flat.numel():
        return rows
    return torch.cat([rows, torch.linalg.vector_norm(flat[whole:]).view(1)])


def _sample(x: torch.Tensor, sample: int | None) -> torch.Tensor:
    """A copy of every value of a contiguous tensor, or of runs of consecutive values spread evenly."""
    if sample is None or x.numel() <= sample:
        return x.clone()
    runs, length, spacing = _sample_layout(x.numel(), sample)
    # clone: always a copy, so a later in-place op on the tensor cannot change the sample
    return x.as_strided((runs, length), (spacing, 1)).clone()


@functools.lru_cache(maxsize=256)
def _sample_layout(n: int, sample: int) -> tuple[int, int, int]:
    """``sample // 64`` runs of 64 values (fewer, shorter runs for a small ``sample``) and their spacing."""
    runs = min(sample, max(1, sample // _RUN))
    length = sample // runs
    return runs, length, _spacing(n, runs, length)


def _spacing(n: int, runs: int, length: int) -> int:
    """Distance between run starts: the largest prime that fits ``runs`` runs into ``n`` values.

    Prime, so run starts fall at every offset of a row or channel instead of the same one.
    """
    widest = (n - length) // max(runs - 1, 1)
    for candidate in range(widest, length - 1, -1):
        if candidate < 4 or all(candidate % d for d in range(2, math.isqrt(candidate) + 1)):
            return candidate
    return widest


def _layout(update: _Update) -> tuple[object, ...]:
    """Updates with the same layout stack into one tensor and are reduced together."""
    return (update.norms.numel(), update.channels, update.sample.numel(), update.total.device)


def _fold(
    before: _Rows | None, updates: Sequence[_Update], bins: int, hist_range: tuple[float, float]
) -> _Rows:
    """A window's updates, plus what its earlier updates were folded into, as one row on the device."""
    groups: dict[tuple[object, ...], list[_Update]] = {}
    for update in updates:
        groups.setdefault(_layout(update), []).append(update)
    parts = [_rows_of(group, bins, hist_range) for group in groups.values()]
    parts += [before] if before is not None else []
    return _Rows(
        torch.cat([part.head for part in parts]).sum(0, keepdim=True),
        torch.cat([part.histogram for part in parts]).sum(0, keepdim=True),
        torch.cat([part.abs_max for part in parts]).amax(0, keepdim=True),
        torch.cat([part.channel_sq for part in parts]).sum(0, keepdim=True),
        [sum(sum(part.sampled) for part in parts)],
    )


def _rows_of(updates: Sequence[_Update], bins: int, hist_range: tuple[float, float]) -> _Rows:
    """Reduce same-layout updates together: a fixed number of device ops, however many there are.

    Reading 100 steps of a layer thus costs about as many op calls as reading one. Samples of tensors
    known to be finite skip the non-finite masking; zeros are counted as ``sign(|x|)`` sums, since
    boolean reductions are 5x slower on CPU.
    """
    samples = torch.stack([update.sample.view(-1) for update in updates])
    finite = None if all(update.nonfinite is None for update in updates) else torch.isfinite(samples)
    magnitude = samples.abs() if finite is None else torch.where(finite, samples.abs(), 0.0)
    abs_max = magnitude.amax(1)
    nonzero = magnitude.sign_().sum(1).to(torch.float64)  # non-finite values count as 0 here
    zero = torch.zeros((), dtype=torch.float64, device=samples.device)
    nonfinite = torch.stack([zero if update.nonfinite is None else update.nonfinite for update in updates])
    sample_nonfinite = zero.expand(len(updates)) if finite is None else (~finite).sum(1).to(torch.float64)
    head = torch.stack(
        [
            torch.stack([update.total for update in updates]).to(torch.float64),
            nonfinite.to(torch.float64),
            samples.shape[1] - nonzero - sample_nonfinite,
            sample_nonfinite,
        ],
        dim=1,
    )
    norms = torch.stack([update.norms for update in updates]).view(len(updates), -1, updates[0].channels)
    squares = norms.to(torch.float64).square_().sum(1)
    histogram = _histograms(samples, finite, bins, hist_range)
    return _Rows(head, histogram, abs_max, squares, [samples.shape[1]] * len(updates))


def _histograms(
    samples: torch.Tensor, finite: torch.Tensor | None, bins: int, hist_range: tuple[float, float]
) -> torch.Tensor:
    """Float64 counts ``(rows, bins)`` of the finite values of each row, binned exactly as ``torch.histc``.

    Same arithmetic as histc on clamped values, so a value on a bin edge lands in the same bin: the
    range rounded to the values' dtype, ``(v - low) * bins / (high - low)``, truncated; clamping the
    bin index puts out-of-range values (and ``high`` itself) into the edge bins. Non-finite values go
    to one extra bin per row that is dropped.
    """
    low, high = hist_range
    as_dtype = _NUMPY_FLOAT[samples.dtype]
    lo = as_dtype(low)
    width = as_dtype(as_dtype(high) - lo)
    position = torch.sub(samples, float(lo)).mul_(bins).div_(float(width)).clamp_(0, bins - 1)
    if finite is not None:
        position = torch.where(finite, position, float(bins))
    rows = samples.shape[0]
    # int32 indices: converting and counting them is twice as fast as int64
    offsets = torch.arange(0, rows * (bins + 1), bins + 1, dtype=torch.int32, device=samples.device)
    index = position.to(torch.int32).add_(offsets[:, None])
    counts = torch.bincount(index.view(-1), minlength=rows * (bins + 1))
    return counts.view(rows, bins + 1)[:, :bins].to(torch.float64)


def several_ranks() -> bool:
    """True inside a ``torch.distributed`` process group of two or more ranks (torchrun, DDP)."""
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def reduce_across_ranks(snapshots: Sequence[DeviceStats]) -> list[DeviceStats]:
    """The snapshots of every rank of a ``torch.distributed`` process group combined, on every rank:
    counts, sums, sums of squares, histograms and non-finite counts add, ``abs_max`` is the maximum — so
    the result is what one process would have measured on all ranks' tensors together. Unchanged outside
    a process group of two or more ranks.

    Every rank must call it at the same point with the same layers in the same order (the loop's
    lockstep: a statistics window that closes). Costs two all-reduces and one host read of the counts.
    """
    if not snapshots or not several_ranks():
        return list(snapshots)
    rows = [_fold(snap.folded, snap.updates, snap.bins, snap.range) for snap in snapshots]
    device = rows[0].head.device
    sums = torch.cat([t.reshape(-1).to(device) for r in rows for t in (r.head, r.histogram, r.channel_sq)])
    counts = [n for snap, r in zip(snapshots, rows, strict=True) for n in (snap.count, r.sampled[0])]
    packed = torch.cat([sums, torch.tensor(counts, dtype=sums.dtype, device=device)])
    maxima = torch.cat([r.abs_max.reshape(-1).to(device) for r in rows])
    torch.distributed.all_reduce(packed)
    torch.distributed.all_reduce(maxima, op=torch.distributed.ReduceOp.MAX)
    host_counts = [round(n) for n in packed[len(sums) :].tolist()]
    reduced, offset = [], 0
    for i, (snap, r) in enumerate(zip(snapshots, rows, strict=True)):
        parts = []
        for t in (r.head, r.histogram, r.channel_sq):
            parts.append(packed[offset : offset + t.numel()].view(t.shape))
            offset += t.numel()
        folded = _Rows(parts[0], parts[1], maxima[i : i + 1], parts[2], [host_counts[2 * i + 1]])
        reduced.append(DeviceStats(host_counts[2 * i], snap.channels, snap.bins, snap.range, (), folded))
    return reduced


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

    Updates of all snapshots that share histogram settings and layout are reduced together (see
    :func:`_rows_of`). Returns the :class:`TensorStats` of the snapshots and float64 arrays shaped like
    ``tensors``.
    """
    groups: dict[tuple[int, tuple[float, float], tuple[object, ...]], list[tuple[int, _Update]]] = {}
    for i, snap in enumerate(snapshots):
        for update in snap.updates:
            groups.setdefault((snap.bins, snap.range, _layout(update)), []).append((i, update))
    reduced = [
        ([i for i, _ in members], _rows_of([update for _, update in members], bins, hist_range))
        for (bins, hist_range, _), members in groups.items()
    ]
    reduced += [([i], snap.folded) for i, snap in enumerate(snapshots) if snap.folded is not None]
    host = to_host([t for _, rows in reduced for t in rows.tensors()] + list(tensors))
    sums: list[_HostSums | None] = [None] * len(snapshots)
    for k, (owners, rows) in enumerate(reduced):
        head, histogram, abs_max, channel_sq = host[4 * k : 4 * k + 4]
        # bulk conversions per group: per-row numpy calls would dominate reading many small windows
        heads, maxes, counts = head.tolist(), abs_max.tolist(), histogram.astype(np.int64)
        for r, i in enumerate(owners):
            row = _HostSums(heads[r], counts[r], maxes[r], channel_sq[r], rows.sampled[r])
            sums[i] = row if sums[i] is None else sums[i].plus(row)
    stats = [_to_tensor_stats(snap, s) for snap, s in zip(snapshots, sums, strict=True) if s is not None]
    return stats, host[4 * len(reduced) :]


@dataclass(frozen=True)
class _HostSums:
    """One window's reductions on the host."""

    head: list[float]
    histogram: np.ndarray
    abs_max: float
    channel_sq: np.ndarray
    sampled: int

    def plus(self, other: _HostSums) -> _HostSums:
        return _HostSums(
            [a + b for a, b in zip(self.head, other.head, strict=True)],
            self.histogram + other.histogram,
            max(self.abs_max, other.abs_max),
            self.channel_sq + other.channel_sq,
            self.sampled + other.sampled,
        )


def _as_snapshot(item: DeviceStats | RunningStats, key: object) -> DeviceStats:
    if isinstance(item, DeviceStats):
        return item
    snap = item.snapshot()
    if snap is None:
        raise ValueError(f"read_stats: the RunningStats at {key!r} has seen no tensor yet; update it first")
    return snap


def _to_tensor_stats(snap: DeviceStats, sums: _HostSums) -> TensorStats:
    total, nonfinite_sum, sample_zeros, sample_nonfinite = sums.head
    nonfinite = round(nonfinite_sum)
    finite = snap.count - nonfinite
    mean = total / finite if finite else math.nan
    var = max(float(sums.channel_sq.sum()) / finite - mean * mean, 0.0) if finite else math.nan
    per_channel = snap.count / sums.channel_sq.size
    return TensorStats(
        count=snap.count,
        mean=mean,
        std=math.sqrt(var),
        abs_max=sums.abs_max if sums.sampled > sample_nonfinite else math.nan,
        zero_fraction=sample_zeros / sums.sampled,
        nonfinite=nonfinite,
        histogram=sums.histogram,
        edges=_edges(snap.range, snap.bins),
        channel_rms=np.sqrt(sums.channel_sq / per_channel) if snap.channels else np.zeros(0),
        sampled=sums.sampled,
    )


@functools.lru_cache(maxsize=64)
def _edges(hist_range: tuple[float, float], bins: int) -> np.ndarray:
    """Bin edges, shared read-only by every :class:`TensorStats` with the same histogram settings."""
    edges = np.linspace(hist_range[0], hist_range[1], bins + 1)
    edges.flags.writeable = False
    return edges


# Scalar fields of TensorStats, in the column order of stats_to_columns; ints are exact in float64.
_SCALARS = ("count", "mean", "std", "abs_max", "zero_fraction", "nonfinite", "sampled")
_INTS = frozenset({"count", "nonfinite", "sampled"})


def stats_to_columns(records: Sequence[TensorStats]) -> dict[str, torch.Tensor]:
    """Records of one stream as a few CPU tensors (plain checkpoint content), exact to the bit.

    Columns, not one dict per record: a checkpoint walks every plain value in Python (check and CRC), so
    a thousand records of 50 histogram bins each must be a handful of tensors, not 50,000 numbers.
    ``records`` must share histogram settings (one :class:`RunningStats`' records do).
    """
    if not records:
        raise ValueError("stats_to_columns: no records; store only streams that recorded something")
    scalars = [[float(getattr(r, name)) for name in _SCALARS] for r in records]
    return {
        "scalars": torch.tensor(scalars, dtype=torch.float64),
        "histogram": torch.from_numpy(np.stack([r.histogram for r in records]).astype(np.int64)),
        "range": torch.tensor([records[0].edges[0], records[0].edges[-1]], dtype=torch.float64),
        "channel_rms": torch.from_numpy(np.concatenate([r.channel_rms for r in records]).astype(np.float64)),
        "channels": torch.tensor([r.channel_rms.size for r in records], dtype=torch.int64),
    }


def stats_from_columns(columns: Mapping[str, torch.Tensor]) -> list[TensorStats]:
    """The records :func:`stats_to_columns` stored, equal to the originals (edges shared as usual)."""
    histogram = columns["histogram"].numpy()
    low, high = columns["range"].tolist()
    edges = _edges((low, high), histogram.shape[1])
    ends = np.cumsum(columns["channels"].numpy())
    rms = np.split(columns["channel_rms"].numpy(), ends[:-1])
    records = []
    for i, row in enumerate(columns["scalars"].tolist()):
        fields = {name: int(v) if name in _INTS else v for name, v in zip(_SCALARS, row, strict=True)}
        records.append(TensorStats(**fields, histogram=histogram[i], edges=edges, channel_rms=rms[i]))
    return records


def to_host(tensors: Sequence[torch.Tensor]) -> list[np.ndarray]:
    """Copy many tensors to the host as float64 numpy arrays with one transfer per device.

    On a device, each tensor is flattened, all are concatenated there, copied once, and split back into
    arrays shaped like the inputs. On the CPU numpy copies each from its memory: no torch op (inside a
    training step each costs 20-80 us).
    """
    out: list[np.ndarray | None] = [None] * len(tensors)
    by_device: dict[torch.device, list[int]] = {}
    for i, t in enumerate(tensors):
        if t.device.type == "cpu":
            out[i] = _host_copy(t)
        else:
            by_device.setdefault(t.device, []).append(i)
    for indices in by_device.values():
        flat = torch.cat([tensors[i].detach().reshape(-1).to(torch.float64) for i in indices]).cpu().numpy()
        offset = 0
        for i in indices:
            n = tensors[i].numel()
            out[i] = flat[offset : offset + n].reshape(tensors[i].shape)
            offset += n
    return [a for a in out if a is not None]


def _host_copy(tensor: torch.Tensor) -> np.ndarray:
    """A float64 numpy copy of a CPU tensor (a copy: the tensor may be a buffer written again later)."""
    try:
        return np.array(tensor.detach().numpy(), dtype=np.float64)
    except TypeError:  # a dtype numpy lacks (bfloat16): through torch's float64
        return tensor.detach().double().numpy()


# ---- sharded tensors (FSDP2's fully_shard, tensor parallelism) ---------------------------------------------


def local_part(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's values of ``tensor``: the local shard of a ``DTensor``, the tensor itself otherwise.

    Statistics work on local parts and combine them across ranks (:func:`combine_shard_norms`), so a
    sharded tensor is never gathered whole.
    """
    dtensor = _dtensor_type()
    return tensor.to_local() if dtensor is not None and isinstance(tensor, dtensor) else tensor


def local_parts(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """:func:`local_part` of each tensor, the ``DTensor`` type looked up once (the per-step paths call
    this for every gradient)."""
    dtensor = _dtensor_type()
    if dtensor is None:
        return list(tensors)
    return [t.to_local() if isinstance(t, dtensor) else t for t in tensors]


def _dtensor_type() -> type | None:
    """``DTensor``, or None while nothing imported it (then no tensor is one): keeps ``import hookscope``
    and the single-process path off ``torch.distributed.tensor``."""
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None)


def whole_norms(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The L2 norm of each whole tensor as one float32 vector on their device, without a host sync.

    Plain tensors take one fused norm; a ``DTensor`` (a sharded parameter or gradient) the norm of its
    local shard, whose square is added over the ranks holding the other shards (one all-reduce per
    process group, however many tensors) — the norm of the whole tensor, never gathered.
    """
    if not tensors:
        return torch.zeros(0, dtype=torch.float32)
    norms = torch.stack(compat.foreach_norm(local_parts(tensors))).to(torch.float32)
    return combine_shard_norms(norms, tensors)


def combine_shard_norms(norms: torch.Tensor, like: Sequence[torch.Tensor]) -> torch.Tensor:
    """``norms`` of the local parts of the tensors ``like`` (one each, in order) turned into norms of the
    whole tensors: for each DTensor, squares added over every mesh dimension it is sharded on (a
    replicated dimension holds copies: nothing to add). Unchanged when no tensor is a DTensor."""
    groups = _shard_groups(like)
    if not groups:
        return norms
    squares = norms.to(torch.float64).square()
    for group, members in groups.items():
        index = torch.tensor(members, device=squares.device)
        part = squares.index_select(0, index)
        torch.distributed.all_reduce(part, group=group)
        squares.index_copy_(0, index, part)
    return squares.sqrt_().to(torch.float32)


def _shard_groups(tensors: Sequence[torch.Tensor]) -> dict[object, list[int]]:
    """The process groups over which each DTensor among ``tensors`` is sharded, with their positions."""
    dtensor = _dtensor_type()
    groups: dict[object, list[int]] = {}
    if dtensor is None:
        return groups
    for i, tensor in enumerate(tensors):
        if not isinstance(tensor, dtensor):
            continue
        for dim, placement in enumerate(tensor.placements):
            if placement.is_partial():
                raise ValueError(
                    f"hookscope statistics: a DTensor of shape {tuple(tensor.shape)} holds partial sums "
                    f"({placement}), whose norm is not that of its parts; redistribute it to Shard or "
                    "Replicate placements before the optimizer step"
                )
            if placement.is_shard():
                groups.setdefault(tensor.device_mesh.get_group(dim), []).append(i)
    return groups


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
        params = local_parts(self.params)  # a DTensor's shard: the optimizer updates it in place
        if len(self._before) != len(params):
            self._before = [torch.empty_like(p) for p in params]
        compat.foreach_copy_(self._before, params)
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
        params = local_parts(self.params)
        compat.foreach_sub_(self._before, params)
        # one fused call for both lists: each op call costs more than these small norms
        norms = torch.stack(compat.foreach_norm(self._before + params))
        norms = combine_shard_norms(norms, self.params + self.params)
        deltas, weights = norms[: len(params)], norms[len(params) :]
        return (deltas / weights.clamp_min(torch.finfo(weights.dtype).tiny)).to(torch.float32)
