"""MLflowCallback: a fit in MLflow, by default in a local SQLite store (a real database, not the file store).

Metrics (``train/loss``, ``train/lr``, ``epoch/*`` and the per-layer statistics scalars) go in batches
through ``MlflowClient.log_batch``; MLflow has no histogram panel, so histograms are not sent. The
configuration becomes params (flattened, ``optimizer.lr``...) and ``config.json``; the doctor's findings
become tags (``doctor.<kind>.<module>`` = ``step N: message``), the run's description and
``doctor/findings.json``; the model summary ``model/summary.txt``; the data description params
``dataset.*`` and ``dataset.json``; the sample predictions a table ``predictions/step-<N>.json`` (with
the images); the final weights ``model/model.safetensors``.

Runs side by side on one SQLite store (a sweep; the default store in one working directory): the tables
are created once, under a file lock beside the database (``.mlflow.db.lock``), and a write that finds the
database locked by another run waits and retries (``_RETRIES`` times) before the tracker gives up with its
one warning. A run is named after its run folder (else MLflow names it), so a sweep's runs are told apart.

With a :class:`~hookscope.callbacks.RunFolder`, the store is ``mlflow.db`` and ``mlartifacts/`` inside the
run folder. MLflow records artifact locations as absolute paths, so when the folder is renamed (the run
finished, or a finished run is resumed) the store's locations are moved with it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sqlite3
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from hookscope.callbacks.trackers.base import Tracker, relative_to, require
from hookscope.callbacks.trackers.records import (
    Predictions,
    Rows,
    as_uint8,
    findings_markdown,
    flat_config,
)
from hookscope.doctor.findings import Finding
from hookscope.folder_lock import exclusive

STORE = "mlflow.db"
ARTIFACTS = "mlartifacts"
_MAX_METRICS, _MAX_PARAMS = 1000, 100  # MLflow's limits per log_batch call
_PARAM_LENGTH = 6000
# a write finding the database locked by another run waits 0.25 s, 0.5 s, ... and tries again
_RETRIES, _RETRY_WAIT_S = 8, 0.25
T = TypeVar("T")


class MLflowCallback(Tracker):
    """Log the fit to an MLflow run.

    ``tracking_uri=None`` uses ``MLFLOW_TRACKING_URI`` when set, else ``sqlite:///mlflow.db`` in the run
    folder (when a :class:`~hookscope.callbacks.RunFolder` is attached) or the working directory, with
    the artifacts in ``mlartifacts/`` next to it. ``experiment`` defaults to ``"hookscope"``;
    ``run_name`` to the run folder's name, else MLflow's own. Rates and the ``log_*`` switches: see
    :class:`~hookscope.callbacks.trackers.base.Tracker`. View it with
    ``mlflow ui --backend-store-uri sqlite:///mlflow.db`` from that folder.
    """

    label = "MLflow"

    def __init__(
        self,
        tracking_uri: str | None = None,
        experiment: str | None = None,
        run_name: str | None = None,
        log_preds: bool = True,
        log_model: bool = True,
        log_dataset: bool = False,
        **rates: Any,
    ) -> None:
        super().__init__(log_preds=log_preds, log_model=log_model, log_dataset=log_dataset, **rates)
        self.tracking_uri, self.experiment, self.run_name = tracking_uri, experiment, run_name
        self.client: Any = None
        self._store: Path | None = None  # the default SQLite store, which follows a renamed run folder

    def open_run(self, folder: Path) -> str:
        require("mlflow", type(self).__name__)
        from mlflow.tracking import MlflowClient

        uri = self.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        self._store = None if uri else folder / STORE
        if self._store is not None:
            _own_copy(folder)
            if self._store.is_file():
                _relocate(self._store, _other_names(self.run_folder(), folder), folder)
            uri = f"sqlite:///{self._store}"
        with _schema_lock(uri):  # the first use of a new store creates its tables: one process at a time
            self.client = _Retrying(MlflowClient(uri))
            _release(self.client)  # an engine cached by an earlier fit may hold a file that has since moved
            if self.run_id is not None:
                self.client.update_run(self.run_id, status="RUNNING")
            else:
                tags = {"mlflow.source.name": "hookscope", "mlflow.source.type": "LOCAL"}
                experiment_id = self._experiment_id(folder)
                run_folder = self.run_folder()
                name = self.run_name or (run_folder.final.name if run_folder is not None else None)
                self.run_id = self.client.create_run(experiment_id, run_name=name, tags=tags).info.run_id
        return relative_to(self._store, folder) if self._store is not None else uri

    def _experiment_id(self, folder: Path) -> str:
        name = self.experiment or "hookscope"
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        # MLflow's default artifact root is ./mlruns of the working directory: keep them by the store
        location = str(folder / ARTIFACTS / re.sub(r"[^\w.-]", "_", name)) if self._store else None
        return self.client.create_experiment(name, artifact_location=location)

    def run_folder_moved(self, old: Path, new: Path) -> None:
        """The run folder was renamed: point the store's artifact locations to the new place."""
        store = new / STORE
        if self._store is not None and self._store.parent == old and store.is_file():
            _relocate(store, [old], new)
            self._store = store

    def how_to_open(self, location: str) -> str:
        uri = f"sqlite:///{location}" if self._store is not None else location
        return f"mlflow ui --backend-store-uri {uri}"

    def write_scalars(self, rows: Rows) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [
            Metric(key, float(value), now, step) for step in sorted(rows) for key, value in rows[step].items()
        ]
        for chunk in _chunks(metrics, _MAX_METRICS):
            self.client.log_batch(self.run_id, metrics=chunk, synchronous=True)

    def write_findings(self, new: list[Finding], every: list[Finding]) -> None:
        from mlflow.entities import RunTag

        tags = [
            RunTag(
                f"doctor.{f.kind}.{_key(f.module or 'model')}", f"step {f.step}: [{f.severity}] {f.message}"
            )
            for f in new
        ]
        tags.append(RunTag("mlflow.note.content", "Doctor findings:\n\n" + findings_markdown(every)))
        self.client.log_batch(self.run_id, tags=tags, synchronous=True)
        self.client.log_dict(self.run_id, [f.to_dict() for f in every], "doctor/findings.json")

    def write_config(self, config: dict[str, Any]) -> None:
        self._params(flat_config(config))
        self.client.log_dict(self.run_id, config, "config.json")

    def write_summary(self, text: str) -> None:
        self.client.log_text(self.run_id, text, "model/summary.txt")

    def write_dataset(self, description: dict[str, Any]) -> None:
        self._params(flat_config(description, "dataset."))
        self.client.log_dict(self.run_id, description, "dataset.json")

    def write_predictions(self, table: Predictions, step: int) -> None:
        import mlflow

        data: dict[str, list[Any]] = {c: [row[i] for row in table.rows] for i, c in enumerate(table.columns)}
        if table.images is not None:
            data["image"] = [mlflow.Image(as_uint8(image)) for image in table.images]
        self.client.log_table(self.run_id, data=data, artifact_file=f"predictions/step-{step}.json")

    def write_model(self, path: Path) -> None:
        self.client.log_artifact(self.run_id, str(path), "model")

    def close_run(self, failed: bool) -> None:
        self.client.set_terminated(self.run_id, "FAILED" if failed else "FINISHED")
        _release(self.client)

    def _params(self, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(_key(k), v[:_PARAM_LENGTH]) for k, v in params.items()]
        for chunk in _chunks(items, _MAX_PARAMS):
            self.client.log_batch(self.run_id, params=chunk, synchronous=True)


class _Retrying:
    """An MlflowClient whose calls wait and retry when SQLite reports the database locked by another
    writer (runs side by side on one store); any other error, or the last retry's, propagates."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def __getattr__(self, name: str) -> Any:
        found = getattr(self.client, name)
        if not callable(found):
            return found

        def call(*args: Any, **kwargs: Any) -> Any:
            attempt = 0
            while True:
                try:
                    return found(*args, **kwargs)
                except Exception as err:
                    attempt += 1
                    if "database is locked" not in str(err) or attempt == _RETRIES:
                        raise
                    time.sleep(_RETRY_WAIT_S * 2 ** (attempt - 1))

        return call


@contextlib.contextmanager
def _schema_lock(uri: str) -> Iterator[None]:
    """For a SQLite store, hold the lock file beside the database; other stores arbitrate themselves."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    database = Path(uri.removeprefix("sqlite:///").split("?")[0])
    with exclusive(database.with_name(f".{database.name}.lock")):
        yield


def _release(client: Any) -> None:
    """Close the store's pooled SQLite connections. MLflow keeps one engine per URI for the whole process;
    a connection left open on a file that is then renamed or replaced (the run folder is, when it ends or
    resumes) fails with "attempt to write a readonly database" the next time it is used."""
    store = getattr(getattr(client, "_tracking_client", None), "store", None)
    engine = getattr(store, "engine", None)
    if engine is not None:
        engine.dispose()


def _chunks(items: list[T], size: int) -> Iterator[list[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _key(text: str) -> str:
    """A valid MLflow key: letters, digits, ``_ - . / :`` and spaces; anything else becomes ``_``."""
    return re.sub(r"[^\w\-./: ]", "_", text)


def _other_names(run_folder: Any, folder: Path) -> list[Path]:
    """Where the store's folder may have been when its locations were written: the run folder's final
    and partial names (a resumed run is copied from one to the other)."""
    if run_folder is None:
        return []
    return [p for p in (run_folder.final, run_folder.partial) if p != folder]


def _relocate(store: Path, olds: Iterable[Path], new: Path) -> None:
    """Rewrite artifact locations under any of ``olds`` to the same place under ``new``.

    MLflow keeps them as absolute paths (or ``file://`` URIs) in these columns; nothing else refers to
    the folder.
    """
    olds = [str(old) for old in olds]
    if not olds:
        return
    columns = (
        ("experiments", "artifact_location"),
        ("runs", "artifact_uri"),
        ("logged_models", "artifact_location"),
    )
    with sqlite3.connect(store) as db:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        for table, column in columns:
            if table not in tables:
                continue
            for rowid, value in db.execute(f"SELECT rowid, {column} FROM {table}").fetchall():
                moved = _moved(value, olds, str(new))
                if moved != value:
                    db.execute(f"UPDATE {table} SET {column} = ? WHERE rowid = ?", (moved, rowid))
    db.close()


def _moved(location: str | None, olds: list[str], new: str) -> str | None:
    if location is None:
        return None
    scheme = "file://" if location.startswith("file://") else ""
    path = location.removeprefix(scheme)
    for old in olds:
        if path == old or path.startswith(old + "/"):
            return scheme + new + path[len(old) :]
    return location


def _own_copy(folder: Path) -> None:
    """Give the store and its artifacts their own copies of any hard-linked file.

    A resumed run folder starts as hard links to the finished one, which must stay intact until the new
    run finishes; SQLite and MLflow write files in place.
    """
    paths = [folder / STORE, *(folder / ARTIFACTS).rglob("*")]
    for path in paths:
        if path.is_file() and not path.is_symlink() and path.stat().st_nlink > 1:
            copy = path.with_name(path.name + ".copy")
            shutil.copy2(path, copy)
            os.replace(copy, path)
