"""The doctor's histories in a checkpoint: a few tensors per layer instead of one object per record.

A checkpoint checks and checksums every plain number it holds, so records are stored as columns (one
tensor per field) and thinned to at most :data:`SAVED_RECORDS` per layer — every n-th record, n a power
of two, as the recorders' own thinning keeps them — so a checkpoint's size does not grow with the run.
See docs/checkpoints.md for the sizes.
"""

from __future__ import annotations

from typing import Any

import torch

from hookscope.doctor.record_types import ParamRecord, StepStats
from hookscope.hooks.stats import stats_from_columns, stats_to_columns

# Records per layer a checkpoint keeps. A full history (1000 records of the 13 layers of the digits CNN,
# activations and output gradients) would add ~27 MB to a 0.7 MB checkpoint; 128 caps it near 3.4 MB.
SAVED_RECORDS = 128


def thin_factor(*histories: dict[str, list[Any]]) -> int:
    """Keep every n-th record (n a power of two, as repeated thinning does) to fit ``SAVED_RECORDS``."""
    longest = max((len(records) for history in histories for records in history.values()), default=0)
    factor = 1
    while -(-longest // factor) > SAVED_RECORDS:
        factor *= 2
    return factor


def thinned(history: dict[str, list[Any]], factor: int) -> dict[str, list[Any]]:
    """Every ``factor``-th record of each layer, the first one kept."""
    return {name: records[::factor] for name, records in history.items()}


def history_state(history: dict[str, list[StepStats]]) -> dict[str, dict[str, torch.Tensor]]:
    """The records of every layer that has some, as columns (see :func:`stats_to_columns`) plus steps."""
    return {
        name: {
            "step": torch.tensor([r.step for r in records]),
            **stats_to_columns([r.stats for r in records]),
        }
        for name, records in history.items()
        if records
    }


def history_from_state(names: list[str], state: dict[str, Any]) -> dict[str, list[StepStats]]:
    """The history :func:`history_state` stored, with an empty list for each of ``names`` it lacks."""
    history: dict[str, list[StepStats]] = {name: [] for name in names}
    for name, columns in state.items():
        steps = columns["step"].tolist()
        history[name] = [StepStats(s, st) for s, st in zip(steps, stats_from_columns(columns), strict=True)]
    return history


def params_state(history: dict[str, list[ParamRecord]]) -> dict[str, dict[str, torch.Tensor]]:
    """Per parameter: steps, (grad_norm, update_ratio) as float64 and which of the two are not None."""
    state = {}
    for name, records in history.items():
        values = [(r.grad_norm, r.update_ratio) for r in records]
        state[name] = {
            "step": torch.tensor([r.step for r in records], dtype=torch.int64),
            "values": torch.tensor(
                [[0.0 if v is None else v for v in pair] for pair in values], dtype=torch.float64
            ),
            "present": torch.tensor([[v is not None for v in pair] for pair in values], dtype=torch.bool),
        }
    return state


def params_from_state(state: dict[str, Any]) -> dict[str, list[ParamRecord]]:
    """The parameter histories :func:`params_state` stored."""
    history = {}
    for name, columns in state.items():
        rows = zip(
            columns["step"].tolist(), columns["values"].tolist(), columns["present"].tolist(), strict=True
        )
        history[name] = [
            ParamRecord(step, *(v if has else None for v, has in zip(values, present, strict=True)))
            for step, values, present in rows
        ]
    return history


def series_state(series: list[tuple[int, float]]) -> dict[str, torch.Tensor]:
    """``(step, value)`` pairs as two tensors."""
    return {
        "step": torch.tensor([step for step, _ in series], dtype=torch.int64),
        "value": torch.tensor([value for _, value in series], dtype=torch.float64),
    }


def series_from_state(state: dict[str, torch.Tensor]) -> list[tuple[int, float]]:
    """The ``(step, value)`` pairs :func:`series_state` stored."""
    return list(zip(state["step"].tolist(), state["value"].tolist(), strict=True))
