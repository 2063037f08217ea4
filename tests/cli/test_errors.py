"""Every error case of the command: one line on stderr naming the thing and the fix, exit code 2 or 1,
no traceback unless --debug, and no run folder left looking complete."""

import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

from hookscope.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if not line.startswith("note:")]
    return code, lines


def images(root, classes=("a", "b"), per_class=4):
    """Tiny random PNGs in ``root/<class>/``."""
    rng = np.random.default_rng(0)
    for name in classes:
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 255, (12, 12, 3), dtype=np.uint8)).save(root / name / f"{i}.png")


def train(capsys, tmp_path, data, *more):
    """``hookscope train`` of a resnet18 on ``data`` for one quick epoch into ``tmp_path/run``."""
    argv = ["--data", str(data), "--model", "resnet18", "--epochs", "1", "--batch-size", "4", "--no-doctor"]
    argv += ["--image-size", "16"]
    return run(capsys, "train", *argv, "--out", str(tmp_path / "run"), *more)


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
    assert "already exists and hookscope did not write it" in lines[0]
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


def test_valid_class_that_train_lacks_is_refused(tmp_path, capsys):
    images(tmp_path / "data" / "train", ("a", "b"))
    images(tmp_path / "data" / "valid", ("a", "d"), per_class=1)
    code, lines = train(capsys, tmp_path, tmp_path / "data")
    assert code == 2 and len(lines) == 1
    assert "data/valid: class(es) d have no folder in" in lines[0] and "data/train" in lines[0]
    assert "add them to the training folder or remove them" in lines[0]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("per_class", "message"),
    [
        (4, "the training set holds one class only (a); a classifier needs at least two"),
        (1, "the training set is empty (every sample went to validation); add samples"),
    ],
)
def test_data_that_cannot_train_is_refused_before_training(tmp_path, capsys, per_class, message):
    images(tmp_path / "data", ("a",), per_class=per_class)
    code, lines = train(capsys, tmp_path, tmp_path / "data")
    assert code == 2 and len(lines) == 1 and f"--data {tmp_path / 'data'}: {message}" in lines[0]
    assert not (tmp_path / "run").exists()


def test_negative_labels_are_refused_before_training(tmp_path, capsys):
    torch.save({"x": torch.randn(8, 3, 16, 16), "y": torch.tensor([0, 1, 2, -1] * 2)}, tmp_path / "d.pt")
    code, lines = train(capsys, tmp_path, tmp_path / "d.pt")
    assert code == 2 and len(lines) == 1 and "d.pt: y holds the label -1; class labels must be" in lines[0]
    assert not (tmp_path / "run").exists()


def test_corrupt_jpeg_found_during_training_names_the_file(tmp_path, capsys):
    images(tmp_path / "data" / "train")
    images(tmp_path / "data" / "valid", per_class=1)
    Image.new("RGB", (64, 64), "red").save(tmp_path / "bad.jpg")
    whole = (tmp_path / "bad.jpg").read_bytes()
    (tmp_path / "data" / "train" / "a" / "bad.jpg").write_bytes(whole[: len(whole) // 2])
    code, lines = train(capsys, tmp_path, tmp_path / "data")
    assert code == 1 and len(lines) == 1
    assert "cannot read " + str(tmp_path / "data" / "train" / "a" / "bad.jpg") in lines[0]
    assert "as an image (Truncated File Read); remove or replace that file" in lines[0]


def test_non_image_file_is_named_by_its_path(tmp_path, capsys):
    images(tmp_path / "data")
    (tmp_path / "data" / "b" / "notes.png").write_text("not an image")
    code, lines = train(capsys, tmp_path, tmp_path / "data")
    assert code == 1 and len(lines) == 1 and "BufferedReader" not in lines[0]
    assert f"cannot read {tmp_path / 'data' / 'b' / 'notes.png'} as an image" in lines[0]


def test_model_factory_that_raises(tmp_path, capsys):
    (tmp_path / "net.py").write_text("def build():\n    raise ValueError('width must be even')\n")
    code, lines = run(capsys, "summary", f"{tmp_path / 'net.py'}:build")
    assert code == 2 and len(lines) == 1
    assert f"model spec '{tmp_path / 'net.py'}:build': build() raised ValueError: width must be" in lines[0]


def test_unknown_device_is_a_usage_error(tmp_path, capsys):
    code, lines = run(capsys, "train", "--device", "tpu9", "--out", str(tmp_path / "run"))
    assert code == 2 and len(lines) == 1
    assert "--device tpu9: not a torch device name; use cpu, cuda or cuda:0" in lines[0]
    assert not (tmp_path / "run").exists()


def test_debug_shows_the_models_own_error(tmp_path, capsys):
    (tmp_path / "vit.py").write_text(
        "import torch\n"
        "class ViT(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        torch._assert(x.shape[-1] == 224, 'Wrong image width! Expected 224 but got 8!')\n"
        "def build():\n    return ViT()\n"
    )
    code = main(["summary", f"{tmp_path / 'vit.py'}:build", "--input-size", "1,3,8,8", "--debug"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" in err
    assert "Expected 224 but got 8" in err.split("direct cause of the following exception")[0]


def test_detection_model_is_not_called_unknown(capsys):
    code, lines = run(capsys, "summary", "fasterrcnn_resnet50_fpn")
    assert code == 2 and len(lines) == 1
    assert "'fasterrcnn_resnet50_fpn' is a torchvision detection model, not a classifier" in lines[0]


def test_warnings_are_one_line_in_the_commands_voice(tmp_path, capsys):
    (tmp_path / "net.py").write_text(
        "import warnings\nfrom torch import nn\n"
        "def build():\n    warnings.warn('width 3 is\\nunusual')\n    return nn.Linear(3, 2)\n"
    )
    shown = warnings.showwarning
    code, lines = run(capsys, "summary", f"{tmp_path / 'net.py'}:build", "--input-size", "1,3")
    assert code == 0 and lines == ["hookscope summary: warning: width 3 is unusual"]
    assert warnings.showwarning is shown


def test_imagenet_weights_fine_tune_a_two_class_folder(tmp_path, capsys):
    from torchvision.models import resnet18

    torch.save(resnet18(weights=None).state_dict(), tmp_path / "imagenet.pt")
    images(tmp_path / "data")
    argv = ["--data", str(tmp_path / "data"), "--epochs", "1", "--batch-size", "8", "--image-size", "32"]
    more = ["--model", "resnet18", "--weights", str(tmp_path / "imagenet.pt"), "--no-doctor"]
    code = main(["train", *argv, *more, "--out", str(tmp_path / "run")])
    notes = [line for line in capsys.readouterr().err.splitlines() if "--weights" in line]
    assert code == 0 and (tmp_path / "run" / "checkpoints").is_dir()
    assert len(notes) == 1 and "skipped fc.weight, fc.bias" in notes[0]
