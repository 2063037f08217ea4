"""``hookscope inspect`` tells what it skips, refuses names that match nothing, and shows its progress.

A two-conv model from a file keeps these in-process runs under a second (ResNet18 end to end is in
test_commands.py).
"""

import io

import pytest

from hookscope.cli import main

MODEL = """
from collections import OrderedDict
from torch import nn

def build():
    return nn.Sequential(OrderedDict(
        conv1=nn.Conv2d(3, 4, 3), conv2=nn.Conv2d(4, 5, 3), pool=nn.AdaptiveAvgPool2d(1),
        flat=nn.Flatten(), fc=nn.Linear(5, 2),
    ))
"""


@pytest.fixture
def model_spec(tmp_path):
    (tmp_path / "tiny.py").write_text(MODEL)
    return f"{tmp_path / 'tiny.py'}:build"


def inspect(capsys, model_spec, out, *options):
    code = main(["inspect", model_spec, "--size", "32", "--out", str(out), *options])
    captured = capsys.readouterr()
    return code, captured.out, captured.err.splitlines()


def test_layers_without_a_feature_map_are_named_on_stderr(model_spec, tmp_path, capsys):
    code, out, err = inspect(capsys, model_spec, tmp_path / "maps", "--select", "conv1,fc")
    assert code == 0
    notes = [line for line in err if "skipped" in line]
    assert notes == [
        "note: --select: skipped fc (Linear, output 1×2): not a 4-D (N, C, H, W) feature map, which is "
        "what a grid draws"
    ]
    assert [p.name for p in (tmp_path / "maps").glob("*.png")] == ["00_conv1.png"]
    assert out.startswith("1 feature-map grids:")


def test_a_name_in_select_that_matches_no_module_is_refused(model_spec, tmp_path, capsys):
    code, _, err = inspect(capsys, model_spec, tmp_path / "maps", "--select", "conv1,fcc,conv9")
    assert code == 2
    assert err == [
        f"hookscope inspect: error: --select: fcc, conv9 are not a module of {model_spec} (closest: fc, "
        "conv2, conv1); give qualified module names (hookscope summary lists them), or one glob such as "
        "'layer1.*' (--debug shows the traceback)"
    ]
    assert list(tmp_path.iterdir()) == [tmp_path / "tiny.py"]  # nothing written


def test_progress_is_one_line_per_grid_on_stderr_when_it_is_not_a_terminal(model_spec, tmp_path, capsys):
    code, _, err = inspect(capsys, model_spec, tmp_path / "maps")
    assert code == 0
    assert [line for line in err if line.startswith("grid ")] == ["grid 1/2: conv1", "grid 2/2: conv2"]


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_is_a_bar_on_a_terminal(model_spec, tmp_path, monkeypatch):
    stderr = _Terminal()
    monkeypatch.setattr("sys.stderr", stderr)
    monkeypatch.delenv("TERM", raising=False)
    assert main(["inspect", model_spec, "--size", "32", "--out", str(tmp_path / "maps")]) == 0
    assert "feature-map grids" in stderr.getvalue() and "grid 1/2" not in stderr.getvalue()
