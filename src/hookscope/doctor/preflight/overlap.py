"""``train_valid_overlap``: validation samples that are also training samples (exact copies of their inputs),
so the validation loss and metrics partly measure memorisation — a split made after augmenting or
oversampling, validation data built from the training data, or data never deduplicated.

Each sample's inputs (not its target: a copy with another label leaks as much) are hashed exactly:
blake2b over the dtype, shape and bytes of every input tensor. The cost is bounded: at most
``max_samples`` samples of each side are hashed, drawn uniformly at random with a seeded generator of
its own when the side is larger — by index from a map-style Dataset (a DataLoader's ``dataset``, so the
loader's shuffling and workers play no part), else the first ``max_samples`` of the loader's batches.
With the training side sampled, a validation copy is found only when its training twin was drawn, so
the share found is scaled up by ``train_total / train_checked`` to estimate the share of the whole set.

Duplicates within the data are no split mistake by themselves: a random split of data holding repeated
samples sends some copies to each side. Under such a split, a validation sample has a copy among the
checked training samples as often as a checked training sample has one among the other checked training
samples. The check counts both and warns only when the validation count is improbable for the training
set's own rate (one-sided binomial test of the two counts, p < ``P_VALUE``). An overlap that rate
explains is reported as ``info`` when it reaches ``INFO_SHARE`` of the validation samples (the data holds
duplicates: oversampling before the split does this too), and not at all below it (a handful of natural
duplicates).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

from hookscope.doctor.findings import Finding
from hookscope.doctor.preflight.probe import finding
from hookscope.doctor.preflight.random_state import random_state_kept
from hookscope.hooks.batch import split_batch
from hookscope.hooks.tensors import tensors_in

# The most samples hashed on each side; a larger side is sampled at random.
MAX_SAMPLES = 10_000
# A warning when the overlap is this improbable under a random split of data with the training set's own
# duplicate rate; below that, an info finding when at least this share of validation samples is found.
P_VALUE, INFO_SHARE = 1e-3, 0.01
# Keys of a dict sample that hold its target, not its inputs.
TARGET_KEYS = frozenset({"label", "labels", "target", "targets", "y"})
# Examples of (validation index, training index) pairs given in the evidence.
EXAMPLES = 5


@dataclass
class _Hashed:
    """The samples checked on one side: their hashes and indices in the order checked, how many samples
    the side holds (None: only batches were reachable and their number is unknown)."""

    keys: list[bytes]
    indices: list[int]
    total: int | None

    @property
    def checked(self) -> int:
        return len(self.keys)

    @property
    def complete(self) -> bool:
        return self.total == self.checked


def train_valid_overlap(
    train: Any, valid: Any, *, max_samples: int = MAX_SAMPLES, seed: int = 0
) -> list[Finding]:
    """Validation samples whose inputs are exact copies of training samples' inputs.

    ``train`` and ``valid`` are each a DataLoader, a map-style Dataset, a tensor (one sample per row), a
    tuple of tensors ``(inputs..., target)``, or any other iterable of ``(inputs..., target)`` batches;
    ``valid=None`` (no validation set) gives no finding. At most ``max_samples`` samples of each side are
    loaded and hashed, chosen at random with ``seed`` when the side holds more. Every random generator,
    the loaders' own included, is left as it was.
    """
    if max_samples < 1:
        raise ValueError(f"train_valid_overlap: max_samples={max_samples}; pass max_samples >= 1")
    if valid is None:
        return []
    generator = torch.Generator().manual_seed(seed)
    with random_state_kept(train), random_state_kept(valid):
        trained = _hashed(train, max_samples, generator)
        validated = _hashed(valid, max_samples, generator)
    if not trained.checked or not validated.checked:
        return []  # an empty side, or inputs that hold no tensor: nothing to compare
    return _overlap_findings(trained, validated, seed)


def _hashed(data: Any, max_samples: int, generator: torch.Generator) -> _Hashed:
    """Hash up to ``max_samples`` samples of ``data``: by index when it is indexable, else from batches."""
    if isinstance(data, torch.Tensor):
        return _from_indexable(lambda i: data[i], len(data), max_samples, generator)
    if isinstance(data, tuple | list) and data and all(isinstance(t, torch.Tensor) for t in data):
        data = TensorDataset(*data)  # (inputs..., target) tensors, one sample per row
    dataset = data.dataset if isinstance(data, DataLoader) else data
    if (
        isinstance(dataset, Dataset)
        and not isinstance(dataset, IterableDataset)
        and hasattr(dataset, "__len__")
    ):
        return _from_indexable(lambda i: _inputs(dataset[i]), len(dataset), max_samples, generator)
    return _from_batches(data, max_samples)


def _from_indexable(get: Any, total: int, max_samples: int, generator: torch.Generator) -> _Hashed:
    """Every sample when there are at most ``max_samples``, else that many drawn uniformly at random."""
    if total <= max_samples:
        indices = list(range(total))
    else:
        indices = torch.randperm(total, generator=generator)[:max_samples].sort().values.tolist()
    keys, kept = [], []
    for i in indices:
        key = _key(get(i))
        if key is not None:
            keys.append(key)
            kept.append(i)
    return _Hashed(keys, kept, total)


def _from_batches(loader: Any, max_samples: int) -> _Hashed:
    """The first ``max_samples`` samples of ``loader``'s batches (no random access to choose others)."""
    keys: list[bytes] = []
    indices: list[int] = []
    position = 0
    for batch in loader:
        for sample in _rows(batch):
            if len(keys) == max_samples:
                return _Hashed(keys, indices, None)
            key = _key(sample)
            if key is not None:
                keys.append(key)
                indices.append(position)
            position += 1
    return _Hashed(keys, indices, position)


def _inputs(sample: Any) -> Any:
    """The inputs of one sample: a dict's values but its target's, a tuple's items but the last."""
    if isinstance(sample, dict):
        return [value for key, value in sample.items() if key not in TARGET_KEYS]
    if isinstance(sample, tuple | list) and len(sample) > 1:
        return sample[:-1]
    return sample


def _rows(batch: Any) -> list[list[torch.Tensor]]:
    """The inputs of each sample of a batch: row ``i`` of every input tensor holding one row per sample."""
    if isinstance(batch, dict):
        inputs = _inputs(batch)
    else:
        inputs, _ = split_batch(batch)
    tensors = tensors_in(inputs)
    if not tensors or tensors[0].dim() == 0:
        return []
    n = tensors[0].shape[0]
    return [[t[i] if t.dim() and t.shape[0] == n else t for t in tensors] for i in range(n)]


def _key(inputs: Any) -> bytes | None:
    """An exact hash of the input tensors: equal inputs collide, different ones practically never."""
    tensors = tensors_in(inputs)
    if not tensors:
        return None
    digest = hashlib.blake2b(digest_size=16)
    for t in tensors:
        flat = t.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{t.dtype}{tuple(t.shape)};".encode())
        digest.update(flat.view(torch.uint8).numpy().tobytes())
    return digest.digest()


def _overlap_findings(train: _Hashed, valid: _Hashed, seed: int) -> list[Finding]:
    """Compare the two sides; a finding when the overlap is more than the data's own duplicates explain,
    or when that explained overlap is large."""
    first_seen: dict[bytes, int] = {}
    for key, index in zip(train.keys, train.indices, strict=True):
        first_seen.setdefault(key, index)
    matches = [
        (v, first_seen[key]) for key, v in zip(valid.keys, valid.indices, strict=True) if key in first_seen
    ]
    if not matches:
        return []
    # training samples with a copy among the other training samples checked
    repeated = sum(c for c in Counter(train.keys).values() if c > 1)
    p_value = _binomial_tail(
        len(matches), len(matches) + repeated, valid.checked / (valid.checked + train.checked)
    )
    share = len(matches) / valid.checked
    if p_value >= P_VALUE and share < INFO_SHARE:
        return []
    scale = train.total / train.checked if train.total else 1.0
    evidence = {
        "found": len(matches),
        "valid_checked": valid.checked,
        "valid_total": valid.total,
        "train_checked": train.checked,
        "train_total": train.total,
        "share_checked": share,
        "estimated_share": min(1.0, share * scale),
        "train_duplicate_share": repeated / train.checked,
        "p_value": p_value,
        "seed": seed,
        "sampling": f"{_sampling(valid, 'validation', seed)}; {_sampling(train, 'training', seed)}",
        "examples": [{"valid": v, "train": t} for v, t in matches[:EXAMPLES]],
    }
    if p_value < P_VALUE:
        return [
            finding("train_valid_overlap", "", "warning", _leak_message(train, valid, evidence), evidence)
        ]
    return [finding("train_valid_overlap", "", "info", _duplicates_message(evidence), evidence)]


def _binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p): how improbable ``k`` validation matches are when ``n`` matches
    (validation and within-training ones together) fall on each side in proportion to its size ``p``."""
    if p >= 1.0:
        return 1.0
    successes = torch.arange(k, n + 1, dtype=torch.float64)
    binomial = torch.distributions.Binomial(n, probs=torch.tensor(p, dtype=torch.float64))
    return float(binomial.log_prob(successes).logsumexp(0).exp().clamp(max=1.0))


def _sampling(side: _Hashed, name: str, seed: int) -> str:
    """How one side's samples were chosen, in words."""
    if side.complete:
        return f"all {side.checked:,} {name} samples"
    if side.total is None:
        return f"first {side.checked:,} {name} samples of the batches (their number unknown)"
    return f"{side.checked:,} of {side.total:,} {name} samples, drawn at random (seed {seed})"


def _leak_message(train: _Hashed, valid: _Hashed, evidence: dict[str, Any]) -> str:
    """The warning: how many validation samples are training samples, how that was counted, the fix."""
    found, seed = evidence["found"], evidence["seed"]
    if train.complete and valid.complete:
        head = (
            f"{found:,} of {valid.checked:,} validation samples ({evidence['share_checked']:.1%}) are also "
            "training samples (the same input tensors)"
        )
    else:
        scaled = f", scaled by {train.total / train.checked:.3g}x for the training samples not checked"
        head = (
            f"{'about' if train.total else 'at least'} {evidence['estimated_share']:.1%} of the validation "
            f"samples are also training samples (the same input tensors): {found:,} of the "
            f"{_sampling(valid, 'validation', seed)} matched one of the {_sampling(train, 'training', seed)}"
            f"{scaled if train.total and not train.complete else ''}"
        )
    duplicates = evidence["train_duplicate_share"]
    within = (
        f", far more than the training set's own duplicates explain ({duplicates:.1%})" if duplicates else ""
    )
    return (
        f"{head}{within}: on those the validation loss and metrics measure memorisation. Split before "
        "augmenting or oversampling and deduplicate, e.g. sklearn's train_test_split on unique samples "
        "(np.unique(x, axis=0, return_index=True))"
    )


def _duplicates_message(evidence: dict[str, Any]) -> str:
    """The info: an overlap the data's own duplicates explain."""
    return (
        f"{evidence['share_checked']:.1%} of the validation samples checked are also training samples, as "
        f"many as the training set's own duplicates explain ({evidence['train_duplicate_share']:.1%} of its "
        "samples have a copy in it): the data holds repeated samples. Copies made by oversampling or "
        "augmenting before the split leak into validation: split first; natural repeats are fair"
    )
