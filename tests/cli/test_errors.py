"""Every error case of the command: one line on stderr naming the thing and the fix, exit code 2 or 1,
no traceback unless --debug, and no run folder left looking complete."""

import subprocess
import sys

import pytest

from hookscope.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if not line.startswith("note:")]
    return code, lines


def test_model_spec_that_cannot_be_imported(capsys):
    code, lines = run(capsys, "summary", "no_such_pkg.nets:build")
    assert code == 2
    assert len(lines) == 1
    assert lines[0].startswith("hookscope summary: error: model spec 'no_such_pkg.nets:build': cannot import")
    assert "install the package, or give a file instead" in lines[0]


def test_image_that_cannot_be_read(tmp_path, capsys):
    (tmp_path / "broken.png").write_bytes(b"not a png at all")
    code, lines = run(
        capsys, "inspect", "resnet18", "--image", str(tmp_path / "broken.png"), "--out", str(tmp_path / "o")
    )
    assert code == 2
    assert len(lines) == 1 and "broken.png as an image" in lines[0] and "give a PNG or JPEG file" in lines[0]
    assert not (tmp_path / "o").exists() and not (tmp_path / ".o.partial").exists()


def test_missing_image_file(tmp_path, capsys):
    code, lines = run(capsys, "inspect", "resnet18", "--image", str(tmp_path / "nope.jpg"))
    assert code == 2 and "no image file at" in lines[0]


def test_data_folder_with_no_classes(tmp_path, capsys):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "readme.txt").write_text("no images here")
    out = tmp_path / "runs" / "x"
    code, lines = run(capsys, "train", "--data", str(tmp_path / "data"), "--out", str(out))
    assert code == 2
    assert len(lines) == 1 and "no class sub-folders with images; lay the images out as" in lines[0]
    assert not (tmp_path / "runs").exists()  # a usage error writes nothing, not even the parent folder


def test_input_size_that_does_not_fit_the_model(capsys):
    code, lines = run(capsys, "summary", "hookscope.models:digits_cnn", "--input-size", "1,3,32,32")
    assert code == 2
    assert len(lines) == 1
    assert "input of shape 1,3,32,32 does not fit model 'hookscope.models:digits_cnn'" in lines[0]
    assert "'features.0.0' (Conv2d)" in lines[0] and "--input-size" in lines[0]


def test_data_that_does_not_fit_the_model_in_train(tmp_path, capsys):
    code, lines = run(capsys, "train", "--model", "resnet18", "--out", str(tmp_path / "r"))
    assert code == 2
    assert "input of shape 1,1,8,8 does not fit model 'resnet18'" in lines[0] and "conv1" in lines[0]
    assert list(tmp_path.iterdir()) == []


def test_unwritable_out(tmp_path, capsys):
    (tmp_path / "a_file").write_text("in the way")
    code, lines = run(capsys, "train", "--out", str(tmp_path / "a_file" / "run"))
    assert code == 1
    assert (
        len(lines) == 1
        and "cannot write the run folder" in lines[0]
        and "choose a writable --out" in lines[0]
    )


def test_out_that_holds_other_files_is_not_touched(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    code, lines = run(capsys, "train", "--out", str(tmp_path))
    assert code == 2
    assert "is not a hookscope run folder" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_resume_of_something_that_is_not_a_run(tmp_path, capsys):
    code, lines = run(capsys, "train", "--resume", str(tmp_path))
    assert code == 2 and "is not a hookscope run folder (no config.json)" in lines[0]


def test_resume_refuses_to_change_the_model(tmp_path, capsys):
    code, lines = run(capsys, "train", "--resume", str(tmp_path), "--model", "resnet18")
    assert code == 2 and "--model cannot change (only --epochs and --device can)" in lines[0]


def test_report_of_a_folder_that_is_not_a_run(tmp_path, capsys):
    code, lines = run(capsys, "report", str(tmp_path))
    assert code == 2 and "is not a hookscope run folder" in lines[0]


def test_fp16_on_cpu_is_a_usage_error(tmp_path, capsys):
    code, lines = run(capsys, "train", "--precision", "fp16", "--device", "cpu", "--out", str(tmp_path / "r"))
    assert code == 2 and "--precision fp16 needs a CUDA device" in lines[0]


def test_argparse_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--epochs", "0"])
    assert exit_.value.code == 2
    assert "--epochs: 0 must be greater than 0" in capsys.readouterr().err


def test_console_entry_exit_code_and_traceback_only_with_debug(tmp_path):
    argv = [sys.executable, "-m", "hookscope", "summary", "no_such_pkg:net"]
    plain = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    debug = subprocess.run([*argv, "--debug"], capture_output=True, text=True, timeout=120)
    assert plain.returncode == debug.returncode == 2
    assert plain.stderr.count("\n") == 1 and "Traceback" not in plain.stderr
    assert "Traceback (most recent call last)" in debug.stderr
