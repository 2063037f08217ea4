"""CSVLogger: fastai's name for the MetricsLogger (``learn.csv_logger``, ``read_log()``)."""

import pytest
from trackers_support import faulty_learner

import hookscope as hs


def test_csv_logger_writes_the_recorders_epochs_where_asked(tmp_path):
    learn = faulty_learner(hs.callbacks.CSVLogger(tmp_path / "logs"))
    learn.fit(2)
    log = learn.csv_logger.read_log()
    epochs = log[log["kind"] == "epoch"]
    assert list(epochs["valid_loss"]) == pytest.approx([row["valid_loss"] for row in learn.recorder.history])
    assert (tmp_path / "logs" / "metrics.jsonl").is_file()


def test_csv_logger_defaults_to_the_working_directory(tmp_path):
    assert hs.callbacks.CSVLogger().folder.resolve() == tmp_path  # the fixture runs each test in tmp_path
