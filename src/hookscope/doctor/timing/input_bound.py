"""``input_bound``: the steps spend a large share of their time waiting for the next batch.

Read from the recent steps (after the warm-up): the median over steps of the share of the step spent in
``data`` (see :mod:`~hookscope.doctor.timing.phases`). A median, so a few stalled steps do not make a run
input-bound; and a wait of under :data:`MIN_WAIT` per step is not worth tuning, whatever its share (a
near-empty model on an in-memory loader). The advice names the loader's actual settings when the loop
handed the loader over (``watch_loader``), and the cores the process may use.
"""

from __future__ import annotations

import numpy as np

from hookscope.doctor.findings import Finding
from hookscope.doctor.timing.loader_settings import LoaderSettings
from hookscope.doctor.timing.phases import DATA, STEP_PHASES

MIN_SHARE = 0.5
MIN_WAIT = 1e-3  # seconds per step
MIN_STEPS = 20


def input_bound(
    steps: np.ndarray,
    rows: np.ndarray,
    loader: LoaderSettings | None,
    cores: int,
    cuda: bool,
    min_share: float = MIN_SHARE,
) -> Finding | None:
    """The finding when the median step waits ``min_share`` of its time or more for data."""
    if len(steps) < MIN_STEPS:
        return None
    totals = rows[:, :STEP_PHASES].sum(axis=1)
    waits = rows[:, DATA]
    shares = waits / np.maximum(totals, 1e-12)
    if not _holds(shares, waits, min_share):
        return None
    share = round(float(np.median(shares)), 4)  # the evidence's value: the message prints the same one
    wait, total = float(np.median(waits)), float(np.median(totals))
    clear = next(k for k in range(MIN_STEPS, len(steps) + 1) if _holds(shares[:k], waits[:k], min_share))
    where = "the device stands idle" if cuda else "the training loop stands still"
    message = (
        f"waiting for data takes {share:.0%} of each training step (median {_ms(wait)} of {_ms(total)}, "
        f"steps {int(steps[0])}-{int(steps[-1])}): {where} until the next batch arrives. "
    )
    if loader is None:
        message += (
            "Pass the DataLoader to the doctor (watch_loader) to have its settings checked. The usual "
            f"fix: num_workers > 0 (this machine gives the process {cores} cores), pin_memory=True on "
            "CUDA, persistent_workers=True; or a cheaper __getitem__ (decode or augment less, cache)."
        )
    else:
        tips = [*loader.advice(cores, cuda), "or make __getitem__ cheaper (decode or augment less, cache)"]
        message += f"The loader has {loader.describe()}. The usual fix: " + "; ".join(tips) + "."
    evidence = {
        "share": share,
        "data_ms": round(wait * 1e3, 3),
        "step_ms": round(total * 1e3, 3),
        "cores": cores,
        "loader": loader.describe() if loader is not None else None,
    }
    return Finding("input_bound", "", int(steps[clear - 1]), "warning", message, evidence)


def _holds(shares: np.ndarray, waits: np.ndarray, min_share: float) -> bool:
    return float(np.median(shares)) >= min_share and float(np.median(waits)) >= MIN_WAIT


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"
