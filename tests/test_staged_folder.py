"""The staged folder behind every run folder: written hidden, renamed at the end, resumed, refusals."""

import json

import pytest

from hookscope.atomic import atomic_write_text
from hookscope.staged_folder import (
    RunFolderError,
    RunFolderWriteError,
    StagedFolder,
    read_json,
)


def test_a_run_is_written_hidden_and_appears_only_when_finished(tmp_path):
    folder = StagedFolder.start(tmp_path / "runs" / "demo")
    assert folder.path == tmp_path / "runs" / ".demo.partial"
    atomic_write_text(folder.file("config.json"), "{}")
    assert not (tmp_path / "runs" / "demo").exists()
    final = folder.finish()
    assert final == tmp_path / "runs" / "demo"
    assert (final / "config.json").is_file()
    assert sorted(p.name for p in final.parent.iterdir()) == ["demo"]


def test_a_finished_run_replaces_an_older_run_of_the_same_name(tmp_path):
    for text in ("first", "second"):
        folder = StagedFolder.start(tmp_path / "demo")
        atomic_write_text(folder.file("config.json"), json.dumps(text))
        folder.finish()
    assert read_json(tmp_path / "demo" / "config.json") == "second"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo"]


def test_a_stale_partial_folder_is_discarded_by_a_fresh_run(tmp_path):
    (tmp_path / ".demo.partial").mkdir()
    (tmp_path / ".demo.partial" / "stale.txt").write_text("x")
    folder = StagedFolder.start(tmp_path / "demo")
    assert list(folder.path.iterdir()) == []


def test_a_folder_with_other_files_is_never_overwritten(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("precious")
    with pytest.raises(RunFolderError, match=r"mine already exists and is not a hookscope run folder"):
        StagedFolder.start(tmp_path / "mine")
    assert (tmp_path / "mine" / "thesis.tex").read_text() == "precious"


def test_an_unwritable_place_is_a_write_error_naming_the_path(tmp_path):
    (tmp_path / "file").write_text("in the way")
    with pytest.raises(RunFolderWriteError, match=r"cannot write the run folder .*file/run.*writable --out"):
        StagedFolder.start(tmp_path / "file" / "run")


def test_resume_continues_a_partial_folder_in_place(tmp_path):
    folder = StagedFolder.start(tmp_path / "demo")
    atomic_write_text(folder.file("config.json"), "{}")
    resumed = StagedFolder.resume(folder.path)
    assert (resumed.path, resumed.final) == (folder.path, tmp_path / "demo")


def test_resume_of_a_finished_run_works_on_a_copy_until_finished(tmp_path):
    folder = StagedFolder.start(tmp_path / "demo")
    atomic_write_text(folder.file("config.json"), '"v1"')
    folder.finish()
    resumed = StagedFolder.resume(tmp_path / "demo")
    atomic_write_text(resumed.file("config.json"), '"v2"')
    assert read_json(tmp_path / "demo" / "config.json") == "v1"
    resumed.finish()
    assert read_json(tmp_path / "demo" / "config.json") == "v2"


def test_resume_refuses_a_folder_that_is_not_a_run(tmp_path):
    with pytest.raises(RunFolderError, match="is not a hookscope run folder"):
        StagedFolder.resume(tmp_path)


def test_read_json_names_a_malformed_file(tmp_path):
    (tmp_path / "config.json").write_text("{oops")
    with pytest.raises(RunFolderError, match=r"config.json is not valid JSON"):
        read_json(tmp_path / "config.json")
