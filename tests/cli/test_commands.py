"""The hookscope command end to end: train writes a complete run folder, resume, inspect, summary, report.

``train`` and ``inspect`` run in a subprocess through ``python -m hookscope``, as a user runs them; the
cheaper checks call :func:`hookscope.cli.main` in-process.
"""

import json
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from PIL import Image

from hookscope.cli import main
from hookscope.run_reader import read_metrics

RUN_FILES = (
    "config.json",
    "metrics.csv",
    "metrics.jsonl",
    "findings.json",
    "summary.txt",
    "summary.json",
    "stats.json",
    "checkpoints/last.pt",
    "checkpoints/best.pt",
    "figures/loss.png",
    "figures/lr.png",
    "figures/activations.png",
    "figures/gradient_flow.png",
    "figures/feature_maps_features.0.0.png",
    "report.html",
)


def hookscope(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "hookscope", *args], cwd=cwd, capture_output=True, text=True, timeout=600
    )


@pytest.mark.slow
def test_train_one_epoch_writes_every_file_of_the_run_folder(tmp_path):
    done = hookscope("train", "--epochs", "1", "--out", "runs/one", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    run = tmp_path / "runs" / "one"
    missing = [name for name in RUN_FILES if not (run / name).is_file()]
    assert not missing
    assert list((run / "figures").glob("colorful_*.png"))
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["one"]
    config = json.loads((run / "config.json").read_text())
    assert config["status"] == "complete"
    assert config["options"]["epochs"] == 1 and config["options"]["model"] == "hookscope.models:digits_cnn"
    assert {"python", "torch", "hookscope", "numpy"} <= set(config["versions"])
    rows = read_metrics(run)
    assert [r["kind"] for r in rows].count("epoch") == 1
    assert [r["step"] for r in rows if r["kind"] == "step"] == [10, 20]
    assert done.stdout.splitlines()[0] == f"report: {run / 'report.html'}"


@pytest.mark.slow
def test_default_training_reaches_90_percent_valid_accuracy_and_prints_the_findings(tmp_path):
    done = hookscope("train", "--out", "runs/demo", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    epochs = [r for r in read_metrics(tmp_path / "runs" / "demo") if r["kind"] == "epoch"]
    assert len(epochs) == 5
    assert epochs[-1]["accuracy"] > 0.9
    assert "doctor: no problem found" in done.stdout or "top findings:" in done.stdout


@pytest.mark.slow
def test_inspect_resnet18_writes_one_grid_per_conv_layer(tmp_path):
    done = hookscope("inspect", "resnet18", "--image", "sample", "--out", "maps", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    grids = sorted((tmp_path / "maps").glob("*.png"))
    assert len(grids) == 20  # resnet18 has 20 Conv2d layers (17 in the blocks, 3 downsample)
    assert grids[0].name == "00_conv1.png" and grids[-1].name == "19_layer4.1.conv2.png"
    index = (tmp_path / "maps" / "index.html").read_text()
    assert all(f'src="{g.name}"' in index for g in grids)
    assert "pretrained weights cannot be downloaded here" in done.stderr


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """One epoch without the doctor: the cheapest complete run folder (tests copy it before changing it)."""
    out = tmp_path_factory.mktemp("quick") / "run"
    assert main(["train", "--epochs", "1", "--no-doctor", "--out", str(out)]) == 0
    return out


def test_resume_continues_a_finished_run_to_more_epochs(quick_run, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(quick_run, out)
    assert main(["train", "--resume", str(out), "--epochs", "2"]) == 0
    epochs = [r for r in read_metrics(out) if r["kind"] == "epoch"]
    assert [r["epoch"] for r in epochs] == [0, 1]
    assert json.loads((out / "config.json").read_text())["options"]["epochs"] == 2
    assert "epoch 2:" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_no_doctor_run_says_so_in_the_report(quick_run):
    assert not (quick_run / "findings.json").exists()
    assert "The doctor was off for this run." in (quick_run / "report.html").read_text()


def test_report_rebuilds_report_html_from_the_run_folder(quick_run, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(quick_run, out)
    (out / "report.html").unlink()
    assert main(["report", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out / "report.html")
    assert "<h2>Model summary</h2>" in (out / "report.html").read_text()


def test_summary_prints_the_table(capsys):
    assert main(["summary", "hookscope.models:digits_cnn", "--input-size", "1,1,8,8"]) == 0
    out = capsys.readouterr().out
    assert "features.0.0 (Conv2d)" in out and "Total params: 56,554" in out


def test_help_of_every_command():
    for command in ("train", "inspect", "summary", "report"):
        with pytest.raises(SystemExit) as exit_:
            main([command, "--help"])
        assert exit_.value.code == 0


def test_train_on_an_image_folder_with_a_model_from_a_file(tmp_path, capsys):
    rng = np.random.default_rng(0)
    for label in ("circle", "square", "triangle"):
        (tmp_path / "shapes" / label).mkdir(parents=True)
        for i in range(6):
            Image.fromarray(rng.integers(0, 255, (24, 24, 3), dtype=np.uint8)).save(
                tmp_path / "shapes" / label / f"{i}.png"
            )
    (tmp_path / "net.py").write_text(
        "from torch import nn\n"
        "def small_cnn(num_classes):\n"
        "    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),\n"
        "                         nn.Linear(4, num_classes))\n"
    )
    out = tmp_path / "run"
    argv = ["train", "--model", f"{tmp_path / 'net.py'}:small_cnn", "--data", str(tmp_path / "shapes")]
    assert main([*argv, "--image-size", "16", "--epochs", "1", "--batch-size", "4", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rows"][-1]["output_shape"] == "1×3"  # three classes, found in the folder
    assert summary["rows"][0]["output_shape"] == "1×4×14×14"  # 16×16 images through a 3×3 conv
    assert (out / "figures" / "feature_maps_0.png").is_file()


@pytest.mark.slow
def test_ctrl_c_keeps_the_partial_run_and_resume_finishes_it(tmp_path):
    command = [sys.executable, "-m", "hookscope", "train", "--epochs", "200", "--no-doctor", "--out", "run"]
    proc = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    partial = tmp_path / ".run.partial"
    deadline = time.monotonic() + 300
    while not (partial / "checkpoints" / "last.pt").is_file() and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    assert f"hookscope train --resume {partial}" in err
    assert not (tmp_path / "run").exists()
    done_epochs = sum(r["kind"] == "epoch" for r in read_metrics(partial))
    assert main(["train", "--resume", str(partial), "--epochs", str(done_epochs + 1)]) == 0
    assert sum(r["kind"] == "epoch" for r in read_metrics(tmp_path / "run")) == done_epochs + 1
    assert not partial.exists()
