"""``input_scale``: inputs far from normalised (raw 0-255 pixels, tiny values, one feature or channel on
another scale than the rest), the UMLAUT/DeepDiagnosis check and Karpathy's "look at the data"."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hookscope.doctor.findings import Finding
from hookscope.doctor.preflight.probe import finding

# The inputs looked at: up to this many samples from the first batches.
SAMPLE_SIZE = 512
# input_scale: the inputs' RMS above LARGE_RMS or every value below TINY_MAX; one feature's (channel's)
# RMS above FEATURE_RATIO times the median feature's.
# Only features non-zero in at least DENSE_FRACTION of the values count towards the median.
LARGE_RMS, TINY_MAX, FEATURE_RATIO, DENSE_FRACTION = 10.0, 1e-2, 100.0, 0.1


def input_scale(inputs: Sequence[Any], first: str) -> list[Finding]:
    """Inputs far from normalised: large (raw 0-255 pixels), tiny, or one feature on another scale."""
    floats = [x.detach() for x in inputs if isinstance(x, torch.Tensor) and x.is_floating_point()]
    if not floats or any(x.dim() != floats[0].dim() for x in floats) or floats[0].dim() < 2:
        return []
    x = torch.cat(floats)[:SAMPLE_SIZE].double()
    if not bool(x.isfinite().all()):
        return []  # NaN/Inf inputs are the non-finite guard's business
    rms, peak = float(x.square().mean().sqrt()), float(x.abs().max())
    where = f"the inputs to `{first}`" if first else "the inputs"
    evidence = {"rms": rms, "min": float(x.min()), "max": float(x.max()), "mean": float(x.mean())}
    one_feature = _feature_scale(x, where, first)
    if one_feature:
        return one_feature
    if rms > LARGE_RMS:
        pixels = evidence["min"] >= 0 and evidence["max"] <= 255 and bool((x == x.round()).all())
        cause = "raw 0-255 pixel values; divide by 255, then" if pixels else "far from unit scale;"
        return [
            finding(
                "input_scale",
                first,
                "warning",
                f"{where} have RMS {rms:.3g} (range {evidence['min']:.3g} .. {evidence['max']:.3g}): {cause} "
                "subtract the training set's mean and divide by its std (per channel or feature)",
                evidence,
            )
        ]
    if 0 < peak < TINY_MAX:
        return [
            finding(
                "input_scale",
                first,
                "warning",
                f"{where} are tiny (largest |value| {peak:.3g}): scaled twice? Standardise them "
                "(mean 0, std 1)",
                evidence,
            )
        ]
    return []


def _feature_scale(x: torch.Tensor, where: str, first: str) -> list[Finding]:
    """One feature (2-D inputs) or channel (images, 4-D and more) on a scale far from the others."""
    if x.dim() == 3:
        return []  # (N, C, L) or (N, T, F): which dimension holds the features is not known
    columns = x.transpose(0, 1).reshape(x.shape[1], -1)
    per_feature = columns.square().mean(1).sqrt()
    # sparse columns (one-hot, counts of rare words) are not the scale of the data
    live = per_feature[(columns != 0).double().mean(1) >= DENSE_FRACTION]
    if len(live) < 2:
        return []
    median, top = float(live.median()), int(per_feature.argmax())
    ratio = float(per_feature[top]) / median
    if ratio <= FEATURE_RATIO:
        return []
    unit = "feature" if x.dim() == 2 else "channel"
    return [
        finding(
            "input_scale",
            first,
            "warning",
            f"{where}: {unit} {top} has RMS {float(per_feature[top]):.3g}, {ratio:.0f}x the median {unit}'s "
            f"({median:.3g}); standardise each {unit} (subtract its mean, divide by its std)",
            {unit: top, "rms": float(per_feature[top]), "median_rms": median, "ratio": ratio},
        )
    ]
