"""For the tracker tests: a learner whose doctor finds a fault at a known step, and reading back what the
trackers wrote with each tracker's own reader: TensorBoard's event accumulator, W&B's record protobufs from
the offline run's ``.wandb`` file, MLflow's client on the SQLite store."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import torch
from torch import nn

import hookscope as hs
from hookscope.data.digits import digits_loaders

_BLOCK = 32768  # the .wandb file is a LevelDB-style log: 32 KiB blocks of framed records
_HEADER = 7  # file header: b":W&B", magic 0xBEE1, version; record header: crc32c, length, type
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def tensorboard(log_dir: Path) -> Any:
    """An EventAccumulator over ``log_dir`` keeping every event (no sampling), loaded."""
    from tensorboard.backend.event_processing import event_accumulator as ea

    keep_all = {ea.SCALARS: 0, ea.HISTOGRAMS: 0, ea.TENSORS: 0, ea.IMAGES: 0}
    accumulator = ea.EventAccumulator(str(log_dir), size_guidance=keep_all)
    accumulator.Reload()
    return accumulator


def tensorboard_texts(accumulator: Any, tag: str) -> list[tuple[int, str]]:
    """``(step, text)`` of every text summary logged under ``tag``."""
    return [
        (event.step, event.tensor_proto.string_val[0].decode())
        for event in accumulator.Tensors(f"{tag}/text_summary")
    ]


def wandb_records(run_dir: Path) -> list[Any]:
    """Every record of the offline run in ``run_dir`` (``wandb/offline-run-*``), as W&B's protobufs, once
    W&B's service has written them all: ``run.finish()`` can return before it has (a loaded machine read
    a run file without its history), so the service is torn down first, as at the process's exit."""
    import wandb
    from wandb.proto import wandb_internal_pb2

    wandb.teardown()

    (path,) = run_dir.glob("run-*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    records, chunk, pos = [], b"", _HEADER
    while pos + _HEADER <= len(data):
        left_in_block = _BLOCK - pos % _BLOCK
        if left_in_block < _HEADER:  # the block's tail is padding
            pos += left_in_block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
        if kind == 0:  # zero padding at the end of a block
            pos += left_in_block
            continue
        chunk += data[pos + _HEADER : pos + _HEADER + length]
        pos += _HEADER + length
        if kind in (_FULL, _LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunk)
            records.append(record)
            chunk = b""
    return records


def wandb_history(run_dir: Path) -> list[dict[str, Any]]:
    """The rows logged with ``run.log``, each a dict of decoded JSON values; W&B splits media (tables,
    histograms) into nested keys, which become nested dicts again."""
    rows = []
    for record in wandb_records(run_dir):
        if record.WhichOneof("record_type") != "history":
            continue
        row: dict[str, Any] = {}
        for item in record.history.item:
            keys = [item.key] if item.key else list(item.nested_key)
            place = row
            for key in keys[:-1]:
                place = place.setdefault(key, {})
            place[keys[-1]] = json.loads(item.value_json)
        rows.append(row)
    return rows


def wandb_series(run_dir: Path, key: str) -> list[tuple[int, Any]]:
    """``(global_step, value)`` of ``key`` in the run's history."""
    return [(row["global_step"], row[key]) for row in wandb_history(run_dir) if key in row]


def wandb_run(records: list[Any]) -> Any:
    """The last run record (id, notes, tags, config updates arrive as run records)."""
    runs = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    return runs[-1]


def mlflow_client(store: Path) -> Any:
    """A client on the SQLite file ``store``, with no connection left from an earlier client: MLflow
    caches one engine per URI, and the run folder's rename replaces the file under it."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{store}")
    client._tracking_client.store.engine.dispose()
    return client


class KillUnits(hs.Callback):
    """At step ``at``, push the first hidden layer's bias far below 0: its ReLU dies, the doctor says so."""

    def __init__(self, at: int) -> None:
        self.at = at

    def after_step(self) -> None:
        if self.learn.training_step == self.at:
            with torch.no_grad():
                self.learn.model[1].bias.fill_(-10.0)


def faulty_learner(*cbs: hs.Callback, dead_at: int = 6, **doctor) -> hs.Learner:
    """An MLP on the bundled digits (1x8x8 images) whose ReLU dies at step ``dead_at``; a quiet Doctor
    recording statistics at every step (``every=1``, not its sparse default schedule) for the trackers."""
    doctor = {"every": 1, **doctor}
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    return hs.Learner(
        model,
        digits_loaders(),
        nn.CrossEntropyLoss(),
        metrics=[hs.metrics.accuracy],
        cbs=[hs.callbacks.Doctor(quiet=True, **doctor), KillUnits(dead_at), *cbs],
        progress=False,
    )


def sweep_member(index: int, folder: str, barrier: Any, results: Any) -> None:
    """One fit of a sweep, in its own (spawned) process: the faulty learner logging to the MLflow store,
    the TensorBoard folder and the W&B folder it shares with the others, starting with them at
    ``barrier``; puts ``(index, what it trained and found, the tracker warnings)`` in ``results``."""
    import os
    import warnings

    os.chdir(folder)
    name = f"member-{index}"
    trackers = [
        hs.callbacks.MLflowCallback(every=1, stats_every=5, run_name=name),
        hs.callbacks.TensorBoardCallback(log_dir="tb", run_name=name, every=1),
        hs.callbacks.WandbCallback(every=1, log_model=False, init_kwargs={"name": name}),
    ]
    learn = faulty_learner(*trackers)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        barrier.wait(timeout=300)
        learn.fit(1)
    ran = {
        "losses": learn.recorder.losses,
        "valid_loss": [row["valid_loss"] for row in learn.recorder.history],
        "findings": [f.kind for f in learn.doctor.findings],
        "mlflow": learn.mlflow.run_id,
        "wandb": learn.wandb.run_id,
    }
    tracker_warnings = [str(w.message) for w in caught if "logging is off" in str(w.message)]
    results.put((index, ran, tracker_warnings))
