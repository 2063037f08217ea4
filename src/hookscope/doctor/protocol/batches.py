"""``repeated_batch`` and ``unshuffled_data``: what the loop feeds the model.

``repeated_batch``: the same inputs for several optimizer steps in a row — ``x, y = next(iter(loader))``
inside the loop, an unshuffled loader re-created every step. The first tensor given to the first forward
with autograd of each watched optimizer step (:mod:`~.looks`) is fingerprinted on the device: two
weighted sums of at most :data:`SAMPLE` of its values, taken at a prime stride over the whole tensor (so a
stride never lines up with an image's rows and samples only its constant border), written into a
:class:`~.ring.DeviceRing`. A check reads the new fingerprints in one transfer; :data:`REPEATS` equal ones
of consecutive steps are a finding. Only inputs that are new tensors are fingerprinted: a loader makes a
new batch tensor at every step, also when it starts a new pass each time, whereas a loop that trains on
one batch on purpose (full-batch training on a small data set, fitting a curve to fixed points, overfitting
a batch as a test) hands the model the very tensor it handed it the step before — that input is skipped
(a weak reference to the last one, no device work). A step that runs the model more than once adds up
the fingerprints of its later forwards' inputs beside its first's: when they are not all its first's, the
step ran the model over a sequence — a REINFORCE episode from the same start state, a decoder fed token
by token after the same start token, however alike two episodes are once the policy has converged — and
is no batch to repeat; gradient accumulation over a repeated batch gives every forward the same inputs
and counts. A loop that makes a new tensor of the same batch at every step (``x.to(device)`` inside the
loop) can say so with ``batches_per_epoch=1``, which switches the check off. A model whose first input
is constant (a fixed mask or position ids given before the data) would need another tensor to look at;
an input that is a view with gaps (a slice of a larger tensor) is skipped rather than copied.

``unshuffled_data``: batches whose label mix is far from the data's — a dataset sorted by label and never
shuffled. From class-index targets (1-D integer tensors; floats — regression, soft labels — and other
shapes are skipped) each watched batch's labels (its first :data:`LABELS`) are copied into a device ring,
one op per step; a check reads the new ones in one transfer and counts them on the host (:data:`CLASSES`
buckets, larger class indices folded onto them). It compares the recent batches (:data:`WINDOW`) with
the running mix of every label seen: their mean total-variation distance from it, against the distance
random sampling gives for their batch size (computed exactly from the binomial) and against that of
batches of a single class. Silent on shuffled data, also with few classes per batch by chance or small batches
(the yardstick grows with them); a sampler that changes the mix on purpose (a curriculum, batches of one
class by design) looks the same. :func:`loader_not_shuffled` tells the Learner that its training loader
does not shuffle before a batch is seen (``info``: a loader reading a dataset shuffled once, or a time
series, in order is fine; the label mix decides).
"""

from __future__ import annotations

import contextlib
import math
import weakref
from collections import deque
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, SequentialSampler

from hookscope.doctor.findings import Finding
from hookscope.doctor.protocol.ring import DeviceRing

SAMPLE = 1024
REPEATS = 3
CLASSES = 128
LABELS = 1024  # labels of a batch kept: a larger batch's first ones are a sample of its mix
WINDOW = 32
MIN_BATCHES = 8
# Share of the way from random sampling's distance to a single-class batch's that the recent batches
# must reach: shuffled data stays near 0, label-sorted data near 1.
SORTED_SCORE = 0.5
RING_ROWS = 64
PLANS = 64  # input sizes whose sampling plan is kept


class RepeatedBatch:
    """Fingerprints of each optimizer step's first input (beside the sum of its later forwards' inputs'), and
    the longest run of equal ones."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled  # off: training on one batch is the plan
        self._plans: dict[tuple[int, torch.device], tuple[int, torch.Tensor]] = {}
        self.ring = DeviceRing(RING_ROWS, 4)  # a step's first input's fingerprint, its later ones' sum
        self._forwards = 0  # forwards with autograd in this step
        self._written = False  # the first one's fingerprint is in the ring's next row (a skipped one's not)
        self._rest = True  # and every later one's is added into the row's last two values
        self._counts: deque[tuple[int, int]] = deque(maxlen=RING_ROWS)  # (step, forwards) of steps of several
        self._input: weakref.ref[torch.Tensor] | None = None  # the input of the last step seen
        self._step = 0
        self._last: tuple[float, float] | None = None
        self._last_step = -1  # the step of the last fingerprint read
        self._run = (0, 0)  # (first step, length) of the current run of equal fingerprints
        self.found: tuple[int, int] | None = None  # (first step, steps) of the first run long enough

    def begin_batch(self, step: int, training: bool) -> None:
        if training:
            self._step = step

    def forward(self, inputs: torch.Tensor | None) -> None:
        """A forward with autograd: fingerprint the first input of the step's first forward, unless it is
        the tensor the step before was given (one batch on purpose), and add up those of its later
        forwards (a step that runs the model over a sequence: see the module's docstring)."""
        if not self.enabled or inputs is None:
            return
        self._forwards += 1
        if self._forwards == 1:
            if self._input is not None and self._input() is inputs:
                return
            self._input = weakref.ref(inputs)
            self._written = self._fingerprint(inputs, self.ring.row(inputs.device, 2), add=False)
        elif self._written and self._rest:
            rest = self.ring.row(inputs.device)[2:]
            self._rest = self._fingerprint(inputs, rest, add=self._forwards > 2)

    def _fingerprint(self, inputs: torch.Tensor, out: torch.Tensor, add: bool) -> bool:
        """Write (``add``: add) the fingerprint of ``inputs`` into ``out``; False where its values cannot
        be sampled without a copy (a view with gaps)."""
        x = inputs.detach() if inputs.requires_grad else inputs
        stride, weights = self._plan(x.numel(), x.device)
        if x.is_contiguous():  # every stride-th value in memory order, in one op
            sample = x.as_strided((weights.shape[1],), (stride,))
        else:
            flat = _flat_view(x)
            if flat is None:
                return False
            sample = flat[::stride]
        if sample.dtype != torch.float32:
            sample = sample.float()
        autocast = torch.is_autocast_enabled(sample.device.type)
        with torch.autocast(sample.device.type, enabled=False) if autocast else contextlib.nullcontext():
            if add:
                out.addmv_(weights, sample)
            else:
                torch.mv(weights, sample, out=out)
        return True

    def step_done(self) -> None:
        # a later forward that could not be fingerprinted leaves the step out (a gap breaks a run)
        if self._written and self._rest:
            self.ring.commit(self._step, 2 if self._forwards == 1 else 4)
            if self._forwards > 1:
                self._counts.append((self._step, self._forwards))
        self._forwards, self._written, self._rest = 0, False, True  # as discard_batch, a call less a step

    def discard_batch(self) -> None:
        self._forwards, self._written, self._rest = 0, False, True

    def read(self, host: np.ndarray) -> None:
        """Follow the runs of equal fingerprints of the steps' first inputs through the rows read. A step
        whose later forwards' inputs differ from its first ran the model over a sequence (their sum is
        not the first's times their number): it ends a run and starts none."""
        counts = dict(self._counts)
        self._counts.clear()
        for step, row in self.ring.take(host):
            value = (float(row[0]), float(row[1]))
            if len(row) > 2:
                later = counts.get(step, 2) - 1
                if not _close((float(row[2]), float(row[3])), (later * value[0], later * value[1]), later):
                    self._run, self._last, self._last_step = (step, 0), None, step
                    continue
            start, length = self._run
            in_a_row = step == self._last_step + 1 and _close(value, self._last)  # looks leave steps out
            self._run = (start, length + 1) if in_a_row else (step, 1)
            self._last, self._last_step = value, step
            first_long_run = self.found is None and self._run[1] >= REPEATS
            if first_long_run or (self.found is not None and self.found[0] == self._run[0]):
                self.found = self._run  # the first long run, followed to its end

    def findings(self) -> list[Finding]:
        if self.found is None:
            return []
        start, steps = self.found
        message = (
            f"optimizer steps {start} to {start + steps - 1} trained on the same inputs: the model sees "
            f"one batch over and over — typically `next(iter(loader))` inside the training loop, which "
            "starts a new pass and returns its first batch every time. Create the iterator once per "
            "epoch (`for x, y in loader:`), or keep one with `it = iter(loader)` outside the loop. "
            "(One batch on purpose, made anew at every step, looks the same: hand the model the same "
            "tensor at every step, or call `plan_run(batches_per_epoch=1)`.)"
        )
        return [Finding("repeated_batch", "", start, "error", message, {"steps": steps})]

    def state_dict(self) -> dict[str, Any]:
        return {
            "last": list(self._last) if self._last else None,
            "last_step": self._last_step,
            "run": list(self._run),
            "found": self.found,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._last = tuple(state["last"]) if state["last"] else None  # type: ignore[assignment]
        self._last_step = int(state.get("last_step", -1))  # older checkpoints: a run starts anew
        self._run = (int(state["run"][0]), int(state["run"][1]))
        self.found = tuple(state["found"]) if state["found"] else None  # type: ignore[assignment]

    def _plan(self, n: int, device: torch.device) -> tuple[int, torch.Tensor]:
        """The sampling stride for ``n`` values and the weights of that many samples, on ``device``."""
        key = (n, device)
        if key not in self._plans:
            if len(self._plans) >= PLANS:
                self._plans.clear()  # inputs of ever new sizes (text of every length): stay bounded
            stride = _next_prime(-(-n // SAMPLE)) if n > SAMPLE else 1
            generator = torch.Generator().manual_seed(0)  # the same fingerprints after a resume
            weights = torch.rand(2, SAMPLE, generator=generator).add_(0.5)
            self._plans[key] = (stride, weights[:, : -(-n // stride)].contiguous().to(device))
        return self._plans[key]


class LabelMix:
    """Each batch's labels in a device ring; at a check, their class histograms on the host, the recent
    ones against the running mix."""

    def __init__(self) -> None:
        self.ring = DeviceRing(RING_ROWS, LABELS, torch.int64)
        self._step = 0
        self.counts = np.zeros(CLASSES)
        self._recent: deque[np.ndarray] = deque(maxlen=WINDOW)
        self._expected: dict[int, tuple[np.ndarray, float]] = {}  # batch size -> (mix, random distance)
        self._new = False  # batches read since the last check
        self.found: tuple[int, float, float] | None = None  # step, mean distance, random sampling's

    def begin_batch(self, step: int, training: bool) -> None:
        if training:
            self._step = step

    def log_target(self, target: Any) -> None:
        """Copy a training batch's class indices (their first :data:`LABELS`) into the ring: one device op;
        they are counted on the host at a check. Other targets are skipped."""
        if not _class_indices(target):
            return
        labels = target.detach()
        used = labels.numel()
        if used > LABELS:
            labels, used = labels[:LABELS], LABELS
        self.ring.row(labels.device, used).copy_(labels)
        self.ring.commit(self._step, used)

    def read(self, host: np.ndarray) -> None:
        """Count each row's labels (one bincount for all rows: each row's classes offset by its index)."""
        labels = [row for _, row in self.ring.take(host)]
        if not labels:
            return
        index = np.repeat(np.arange(len(labels)), [len(row) for row in labels]) * CLASSES
        flat = np.concatenate(labels).astype(np.int64) % CLASSES + index
        table = np.bincount(flat, minlength=len(labels) * CLASSES).reshape(-1, CLASSES).astype(np.float64)
        self.counts += table.sum(axis=0)
        self._recent.extend(table)
        self._new = True

    def check(self) -> None:
        """Compare the recent batches with the running mix (host numbers only)."""
        new, self._new = self._new, False
        if not new or self.found is not None or len(self._recent) < MIN_BATCHES:
            return
        if np.count_nonzero(self.counts) < 2:
            return
        mix = self.counts / self.counts.sum()
        single = 1.0 - float((mix * mix).sum())  # a one-class batch's distance, on average
        recent = np.stack(list(self._recent))
        sizes = recent.sum(axis=1)
        distances = 0.5 * np.abs(recent / sizes[:, None] - mix).sum(axis=1)
        batch_sizes = sizes.astype(int).tolist()
        expected = {n: self._random(mix, n) for n in set(batch_sizes)}  # once per batch size
        random = float(np.mean([expected[n] for n in batch_sizes]))
        if single - random < 0.1:
            return  # batches too small to tell a sorted mix from a random one
        distance = float(distances.mean())
        if (distance - random) / (single - random) > SORTED_SCORE:
            self.found = (self._step, distance, random)

    def _random(self, mix: np.ndarray, n: int) -> float:
        """:func:`_random_distance`, computed again only once the mix moved (by 0.02 in total)."""
        cached = self._expected.get(n)
        if cached is None or np.abs(cached[0] - mix).sum() > 0.02:
            cached = self._expected[n] = (mix, _random_distance(mix, n))
        return cached[1]

    def findings(self) -> list[Finding]:
        if self.found is None:
            return []
        step, distance, random = self.found
        message = (
            f"the batches up to step {step} hold far fewer classes than the data: their label mix is "
            f"{distance:.2f} (total variation) from the mix of every label seen, where random batches of "
            f"that size would be {random:.2f} from it — the data is sorted by label (or grouped) and not "
            "shuffled, so the model chases one class after the other. Shuffle the training data "
            "(`DataLoader(..., shuffle=True)`)."
        )
        evidence = {"distance": distance, "random_distance": random}
        return [Finding("unshuffled_data", "", step, "warning", message, evidence)]

    def state_dict(self) -> dict[str, Any]:
        recent = np.stack(list(self._recent)) if self._recent else np.zeros((0, CLASSES))
        return {
            "counts": torch.from_numpy(self.counts.copy()),
            "recent": torch.from_numpy(recent),
            "found": list(self.found) if self.found else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.counts = state["counts"].numpy().copy()
        self._recent = deque(state["recent"].numpy().copy(), maxlen=WINDOW)
        found = state["found"]
        self.found = (int(found[0]), float(found[1]), float(found[2])) if found else None


def loader_not_shuffled(dataloader: Any) -> list[Finding]:
    """``unshuffled_data`` for a training loader that reads its dataset in order (a ``SequentialSampler``,
    or a ``DistributedSampler(shuffle=False)``); nothing for an ``IterableDataset`` (it has no order to
    shuffle here), a custom batch sampler or anything that is not a ``DataLoader``."""
    if not isinstance(dataloader, DataLoader) or isinstance(dataloader.dataset, IterableDataset):
        return []
    sampler = getattr(dataloader.batch_sampler, "sampler", None)
    in_order = isinstance(sampler, SequentialSampler) or (
        isinstance(sampler, DistributedSampler) and not sampler.shuffle
    )
    if not in_order:
        return []
    message = (
        "the training DataLoader does not shuffle (its sampler reads the dataset in order): a dataset "
        "stored by class gives batches of one class after the other, and every epoch the same batches. "
        "Pass `shuffle=True` to the training DataLoader (`DistributedSampler(shuffle=True)` under torchrun)."
    )
    evidence = {"sampler": type(sampler).__name__}
    # info: reading in order harms only data stored by class (a dataset shuffled once, or a time series,
    # reads in order on purpose); the batches' label mix is the evidence, a warning when it is far off
    return [Finding("unshuffled_data", "", 0, "info", message, evidence)]


def _close(a: tuple[float, float], b: tuple[float, float] | None, terms: int = 1) -> bool:
    """Whether two fingerprints (``a`` a float32 sum of ``terms`` of them) are equal but for rounding."""
    if b is None:
        return False
    return all(abs(x - y) <= 1e-6 * terms * max(1.0, abs(y)) for x, y in zip(a, b, strict=True))


def _flat_view(x: torch.Tensor) -> torch.Tensor | None:
    """``x`` as one dimension without a copy: its values in memory order (a channels-last batch is read
    as it is stored); None when that needs a copy (a view with gaps), which a check is not worth."""
    if x.is_contiguous():
        return x.view(-1)
    order = sorted(range(x.dim()), key=lambda d: -x.stride(d))
    dense = x.permute(order)
    return dense.view(-1) if dense.is_contiguous() else None


def _class_indices(target: Any) -> bool:
    """A 1-D integer tensor of at least two labels: class indices, one per sample."""
    return (
        isinstance(target, torch.Tensor)
        and target.dim() == 1
        and target.numel() >= 2
        and not target.is_floating_point()
        and not target.is_complex()
        and target.dtype != torch.bool
    )


def _random_distance(mix: np.ndarray, n: int) -> float:
    """Expected total-variation distance from ``mix`` of a batch of ``n`` labels drawn at random from it:
    half the sum over classes of the binomial's mean absolute deviation (de Moivre), over ``n``."""
    return 0.5 * sum(_binomial_mad(n, float(p)) for p in mix if p > 0) / n


def _binomial_mad(n: int, p: float) -> float:
    """E|X - np| for X ~ Binomial(n, p), by de Moivre's closed form."""
    m = math.floor(n * p)
    if m + 1 > n or p >= 1.0:
        return 0.0
    log = (
        math.log(2 * (m + 1))
        + math.lgamma(n + 1)
        - math.lgamma(m + 2)
        - math.lgamma(n - m)
        + (m + 1) * math.log(p)
        + (n - m) * math.log1p(-p)
    )
    return math.exp(log)


def _next_prime(n: int) -> int:
    candidate = max(2, n)
    while any(candidate % d == 0 for d in range(2, math.isqrt(candidate) + 1)):
        candidate += 1
    return candidate
