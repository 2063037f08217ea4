"""``hookscope train --preflight``: the checks run before training, print, land in preflight.json and in
the report, and an error among them fails the run like a doctor's error."""

import json

import pytest

from hookscope.cli import main

pytestmark = pytest.mark.usefixtures("deterministic")


def test_a_softmax_before_cross_entropy_is_found_before_training_and_fails_the_run(tmp_path, capsys):
    (tmp_path / "net.py").write_text(
        "from torch import nn\n"
        "def softmax_mlp(num_classes):\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, num_classes),\n"
        "                         nn.Softmax(dim=1))\n"
    )
    out = tmp_path / "run"
    argv = ["train", "--model", f"{tmp_path / 'net.py'}:softmax_mlp", "--preflight", "--no-doctor"]
    assert main([*argv, "--epochs", "1", "--batch-size", "256", "--out", str(out)]) == 1

    printed = capsys.readouterr()
    assert printed.out.startswith(
        "preflight found 1 problem(s) before training:\n  [error] output_loss_mismatch 4:"
    )
    partial = tmp_path / ".run.partial"
    (finding,) = json.loads((partial / "preflight.json").read_text())
    assert (finding["kind"], finding["module"], finding["severity"]) == ("output_loss_mismatch", "4", "error")
    report = (partial / "report.html").read_text()
    assert "<h2>Preflight</h2>" in report and "already a softmax" in report
    config = json.loads((partial / "config.json").read_text())
    assert config["options"]["preflight"] is True and config["status"] == "failed"
