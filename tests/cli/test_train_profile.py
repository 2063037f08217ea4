"""``hookscope train --profile``: the doctor profiles a few steps after the warm-up and names the layers
that take most of the forward and backward time in findings.json; without the doctor it is refused."""

import json

from hookscope.cli import main


def test_profile_names_the_slowest_layers_in_the_findings(tmp_path):
    out = tmp_path / "run"
    assert main(["train", "--epochs", "1", "--batch-size", "32", "--profile", "--out", str(out)]) == 0
    findings = json.loads((out / "findings.json").read_text())
    (finding,) = [f for f in findings if f["kind"] == "slow_layers"]
    assert finding["evidence"]["steps"] == [10, 11, 12, 13, 14]
    assert set(finding["evidence"]["shares"]) <= set(finding["evidence"]["ms_per_step"])
    assert finding["module"] == next(iter(finding["evidence"]["shares"]))
    assert json.loads((out / "config.json").read_text())["options"]["profile"] is True


def test_profile_without_the_doctor_is_refused(tmp_path, capsys):
    assert main(["train", "--profile", "--no-doctor", "--out", str(tmp_path / "run")]) == 2
    assert not (tmp_path / "run").exists()
    assert "--profile names slow layers through the doctor: drop --no-doctor" in capsys.readouterr().err
