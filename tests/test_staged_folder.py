"""The staged folder behind every run folder: written hidden, renamed at the end, resumed, refusals."""

import json

import pytest

from hookscope.atomic import atomic_write_text
from hookscope.staged_folder import (
    MARKER,
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


def test_a_finished_run_replaces_an_older_run_of_the_same_name_only_when_asked(tmp_path):
    folder = StagedFolder.start(tmp_path / "demo")
    atomic_write_text(folder.file("config.json"), json.dumps("first"))
    folder.finish()
    with pytest.raises(RunFolderError, match=r"demo already holds a hookscope train run; pass --overwrite"):
        StagedFolder.start(tmp_path / "demo")
    folder = StagedFolder.start(tmp_path / "demo", overwrite=True)
    atomic_write_text(folder.file("config.json"), json.dumps("second"))
    folder.finish()
    assert read_json(tmp_path / "demo" / "config.json") == "second"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo"]


def test_a_stale_partial_folder_without_a_run_is_discarded_by_a_fresh_run(tmp_path):
    (tmp_path / ".demo.partial").mkdir()
    (tmp_path / ".demo.partial" / "stale.txt").write_text("x")
    folder = StagedFolder.start(tmp_path / "demo")
    assert [p.name for p in folder.path.iterdir()] == [MARKER]


def test_an_unfinished_run_is_never_discarded_without_overwrite(tmp_path):
    partial = tmp_path / ".demo.partial"
    (partial / "checkpoints").mkdir(parents=True)
    (partial / "config.json").write_text("{}")
    (partial / "checkpoints" / "last.pt").write_bytes(b"weights")
    with pytest.raises(RunFolderError, match=r"unfinished run .*`hookscope train --resume .*demo.partial`"):
        StagedFolder.start(tmp_path / "demo")
    assert (partial / "checkpoints" / "last.pt").read_bytes() == b"weights"
    assert list(StagedFolder.start(tmp_path / "demo", overwrite=True).path.iterdir()) == [partial / MARKER]


def test_a_folder_with_other_files_is_never_overwritten(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("precious")
    for overwrite in (False, True):
        with pytest.raises(RunFolderError, match=r"mine already exists and hookscope did not write it"):
            StagedFolder.start(tmp_path / "mine", overwrite=overwrite)
    assert (tmp_path / "mine" / "thesis.tex").read_text() == "precious"


def test_a_config_json_alone_does_not_make_a_folder_hookscope_s(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "pytorch_model.bin").write_text("weights")
    with pytest.raises(RunFolderError, match="hookscope did not write it"):
        StagedFolder.start(model, overwrite=True)
    assert (model / "pytorch_model.bin").read_text() == "weights"


def test_the_folder_you_are_in_is_never_an_out(tmp_path, monkeypatch):
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    monkeypatch.chdir(project / "src")
    for out in (".", "..", str(project)):
        with pytest.raises(RunFolderError, match="is the folder you are in"):
            StagedFolder.start(out, overwrite=True)
    assert (project / "src").is_dir()


def test_a_run_folder_and_an_inspect_folder_never_replace_each_other(tmp_path):
    StagedFolder.start(tmp_path / "run").finish()
    with pytest.raises(RunFolderError, match="holds a hookscope train folder, not inspect output"):
        StagedFolder.start(tmp_path / "run", "inspect", overwrite=True)
    StagedFolder.start(tmp_path / "maps", "inspect").finish()
    with pytest.raises(RunFolderError, match="holds a hookscope inspect folder, not train output"):
        StagedFolder.start(tmp_path / "maps", "train", overwrite=True)


def test_resuming_a_finished_run_links_its_files_instead_of_copying_them(tmp_path):
    folder = StagedFolder.start(tmp_path / "demo")
    atomic_write_text(folder.file("checkpoints/last.pt"), "x" * 1000)
    atomic_write_text(folder.file("config.json"), "{}")
    folder.finish()
    resumed = StagedFolder.resume(tmp_path / "demo")
    original, copy = tmp_path / "demo" / "checkpoints" / "last.pt", resumed.path / "checkpoints" / "last.pt"
    assert original.stat().st_ino == copy.stat().st_ino  # no disk used until a file is replaced
    atomic_write_text(copy, "new")  # atomic writes replace the link: the finished run is untouched
    assert original.read_text() == "x" * 1000


def test_an_unwritable_place_is_a_write_error_naming_the_path(tmp_path):
    (tmp_path / "file").write_text("in the way")
    with pytest.raises(RunFolderWriteError, match=r"cannot write the run folder .*file/run.*writable --out"):
        StagedFolder.start(tmp_path / "file" / "run")


def test_resume_continues_a_partial_folder_in_place(tmp_path):
    folder = StagedFolder.start(tmp_path / "demo")
    atomic_write_text(folder.file("config.json"), "{}")
    folder.release()  # the first writer is done (else the resume is refused: see the lock tests)
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
