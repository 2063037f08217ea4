"""Atomic writes: old file or whole new file, never a part; readable by others; no temp file left."""

import json
import stat

import pytest
import torch

from hookscope.atomic import atomic_write, atomic_write_json, atomic_write_text


def test_atomic_write_replaces_the_file_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "sub" / "a.txt"
    atomic_write_text(path, "old")
    atomic_write_text(path, "new")
    assert path.read_text() == "new"
    assert [p.name for p in path.parent.iterdir()] == ["a.txt"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_atomic_write_json_writes_paths_as_strings(tmp_path):
    atomic_write_json(tmp_path / "c.json", {"out": tmp_path, "n": 1})
    assert json.loads((tmp_path / "c.json").read_text()) == {"out": str(tmp_path), "n": 1}


def test_a_write_failing_half_way_keeps_the_old_file_and_no_temp_file(tmp_path):
    path = tmp_path / "a.txt"
    atomic_write_text(path, "old")

    def half_then_fail(file):
        file.write(b"ne")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, half_then_fail)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def test_a_streamed_checkpoint_is_readable_by_others(tmp_path):
    path = atomic_write(tmp_path / "w.pt", lambda file: torch.save({"w": torch.ones(2)}, file))
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert torch.equal(torch.load(path, weights_only=True)["w"], torch.ones(2))
