"""Fixtures for the tracker tests: every tracker writes under pytest's tmp_path and nothing leaves the
machine (W&B offline, MLflow on a local SQLite file)."""

from __future__ import annotations

import sys

import pytest


@pytest.fixture(autouse=True)
def offline(tmp_path, monkeypatch):
    """Run each test in its own folder, with W&B offline and its caches there too."""
    for name in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_CONFIG_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    yield
    if "wandb" in sys.modules:  # a fresh W&B service per test, started under that test's output capture
        sys.modules["wandb"].teardown()
