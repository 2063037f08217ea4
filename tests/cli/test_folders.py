"""hookscope train never loses a folder: what it may replace, when it replaces it, and how a run is resumed.

Each test is a case a user hit: the folder's files are still there afterwards, the exit code, and one
stderr line naming the cause and the way past it.
"""

import json
import shutil

import pytest
import torch

from hookscope.cli import main

TRAIN = ("train", "--epochs", "1", "--batch-size", "128", "--seed", "0")


def run(capsys, *argv):
    """Exit code, stdout and the stderr lines of one in-process ``hookscope`` command (``note:`` lines,
    which inform rather than explain a failure, left out)."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, [line for line in err.splitlines() if line.strip() and not line.startswith("note:")]


@pytest.fixture(scope="module")
def good_run(tmp_path_factory):
    """A finished one-epoch run of the demo model (copied by the tests that change it)."""
    out = tmp_path_factory.mktemp("good") / "run"
    assert main([*TRAIN, "--out", str(out)]) == 0
    return out


def test_a_folder_with_a_config_json_is_not_taken_for_a_run(tmp_path, capsys):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "pytorch_model.bin").write_text("x")
    code, _, err = run(capsys, *TRAIN, "--out", str(model))
    assert code == 2 and len(err) == 1
    assert "already exists and hookscope did not write it" in err[0] and "choose another --out" in err[0]
    assert sorted(p.name for p in model.iterdir()) == ["config.json", "pytorch_model.bin"]


def test_out_dot_inside_a_project_is_refused(tmp_path, capsys, monkeypatch):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "code.py").write_text("print(1)")
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, *TRAIN, "--out", ".", "--overwrite")
    assert code == 2 and len(err) == 1 and "is the folder you are in" in err[0]
    assert (tmp_path / "src" / "code.py").read_text() == "print(1)"


def test_a_finished_run_is_replaced_only_with_overwrite(good_run, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(good_run, out)
    before = (out / "config.json").read_text()
    code, _, err = run(capsys, *TRAIN, "--out", str(out))
    assert code == 2 and len(err) == 1 and "already holds a hookscope train run; pass --overwrite" in err[0]
    assert (out / "config.json").read_text() == before
    assert run(capsys, *TRAIN, "--out", str(out), "--overwrite")[0] == 0
    assert (out / ".hookscope").is_file() and (out / "report.html").is_file()


def test_inspect_never_replaces_a_training_run(good_run, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(good_run, out)
    code, _, err = run(capsys, "inspect", "resnet18", "--size", "32", "--out", str(out))
    assert code == 2 and len(err) == 1 and "holds a hookscope train folder, not inspect output" in err[0]
    assert (out / "checkpoints" / "last.pt").is_file() and not (out / "index.html").exists()


def test_rerunning_after_an_interruption_points_at_resume_and_deletes_nothing(good_run, tmp_path, capsys):
    partial = tmp_path / ".run.partial"
    shutil.copytree(good_run, partial)  # what Ctrl-C leaves: the unfinished run, its checkpoints
    code, _, err = run(capsys, *TRAIN, "--out", str(tmp_path / "run"))
    assert code == 2 and len(err) == 1
    assert f"hookscope train --resume {partial}" in err[0] and "--overwrite" in err[0]
    assert (partial / "checkpoints" / "last.pt").is_file()


def nan_data(path):
    """A .pt data file whose images are all NaN: the doctor's guard stops the fit at step 0."""
    x = torch.full((64, 1, 8, 8), float("nan"))
    torch.save({"x": x, "y": torch.arange(64) % 2}, path)
    return path


def test_a_doctor_stop_keeps_the_findings_and_the_previous_run(good_run, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(good_run, out)
    data = nan_data(tmp_path / "nan.pt")
    code, stdout, err = run(capsys, *TRAIN, "--data", str(data), "--out", str(out), "--overwrite")

    assert code == 1 and len(err) == 2  # the finding as the doctor saw it, then why the run is not kept
    assert err[0].startswith("Doctor [error] nonfinite: training stopped at step 0")
    assert "the doctor found 1 error(s)" in err[1] and f"{out} is untouched" in err[1]
    assert "[error]" in stdout and "doctor: no problem found" not in stdout
    assert (out / "checkpoints" / "last.pt").is_file()  # the good run is still there, unchanged
    partial = tmp_path / ".run.partial"
    findings = json.loads((partial / "findings.json").read_text())
    assert findings[0]["kind"] == "nonfinite" and findings[0]["step"] == 0
    config = json.loads((partial / "config.json").read_text())
    assert config["status"] == "failed" and "the doctor found" in config["error"]
    assert "the doctor found 1 error" in (partial / "report.html").read_text()


def corrupt(path):
    """Replace ``path`` by a truncated copy (a new file: the hard links to the old one stay intact)."""
    data = path.read_bytes()
    path.unlink()
    path.write_bytes(data[: len(data) // 3])


@pytest.mark.filterwarnings("ignore:.*was saved during fit:UserWarning")  # the run is extended on purpose
def test_an_unreadable_last_pt_falls_back_to_the_newest_checkpoint_that_loads(tmp_path, capsys):
    from torch import nn

    import hookscope as hs
    from hookscope.data.digits import digits_loaders
    from hookscope.models import digits_cnn

    every_3 = {"every_n_steps": 3, "keep_last": 3, "sigint": False}
    out = tmp_path / "run"

    def learner():
        torch.manual_seed(0)
        cbs = [hs.callbacks.RunFolder(out, figures=False, checkpoints=every_3)]
        return hs.Learner(digits_cnn(), digits_loaders(batch_size=256), nn.CrossEntropyLoss(), cbs=cbs)

    learner().fit(1)
    corrupt(out / "checkpoints" / "last.pt")
    with pytest.warns(UserWarning, match=r"last.pt cannot be loaded .* resuming from .*ckpt-00000006.pt"):
        learner().fit(2, resume=out)
    assert json.loads((out / "config.json").read_text())["resumed_from"].endswith("ckpt-00000006.pt")


def test_when_no_checkpoint_loads_resume_from_is_offered_and_nothing_is_copied(good_run, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(good_run, out, copy_function=shutil.copy2)
    keep = tmp_path / "keep.pt"
    shutil.copy2(out / "checkpoints" / "last.pt", keep)
    for checkpoint in (out / "checkpoints").glob("*.pt"):
        corrupt(checkpoint)
    code, _, err = run(capsys, "train", "--resume", str(out), "--epochs", "2")
    assert code != 0 and len(err) == 1 and "--resume-from FILE" in err[0]
    assert not (tmp_path / ".run.partial").exists()  # a failed resume leaves no copy behind

    code, _, err = run(capsys, "train", "--resume", str(out), "--resume-from", str(keep), "--epochs", "2")
    assert code == 0, err
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows if r["kind"] == "epoch"] == [0, 1]


def test_resuming_another_runs_checkpoint_is_refused_unless_allow_other_run(good_run, tmp_path, capsys):
    other = tmp_path / "other"
    assert main([*TRAIN, "--lr", "0.01", "--out", str(other)]) == 0
    capsys.readouterr()
    theirs = str(good_run / "checkpoints" / "last.pt")
    resume = ("train", "--resume", str(other), "--resume-from", theirs, "--epochs", "2")

    code, _, err = run(capsys, *resume)
    assert code != 0 and len(err) == 1
    assert "is a checkpoint of another run (lr: 0.003 there, 0.01 here)" in err[0]
    assert "--allow-other-run" in err[0]
    rows = [json.loads(line) for line in (other / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows if r["kind"] == "epoch"] == [0]  # the refused resume trained nothing

    code, _, err = run(capsys, *resume, "--allow-other-run")
    assert code == 0, err
    rows = [json.loads(line) for line in (other / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows if r["kind"] == "epoch"] == [0, 1]
    assert json.loads((other / "config.json").read_text())["resumed_from"] == theirs


def test_allow_other_run_needs_resume(tmp_path, capsys):
    code, _, err = run(capsys, *TRAIN, "--out", str(tmp_path / "run"), "--allow-other-run")
    assert code == 2 and len(err) == 1 and "--allow-other-run" in err[0] and "--resume RUN_DIR" in err[0]
    assert not (tmp_path / "run").exists()


def test_resume_does_not_say_the_model_starts_from_random_weights(tmp_path, capsys):
    from PIL import Image

    for label in ("a", "b"):
        (tmp_path / "photos" / label).mkdir(parents=True)
        for i in range(4):
            pixels = torch.full((16, 16, 3), 30 * i + (120 if label == "b" else 0), dtype=torch.uint8)
            Image.fromarray(pixels.numpy()).save(tmp_path / "photos" / label / f"{i}.png")
    out = str(tmp_path / "run")
    common = ("--model", "resnet18", "--data", str(tmp_path / "photos"), "--image-size", "32")
    assert main(["train", *common, "--epochs", "1", "--batch-size", "4", "--no-doctor", "--out", out]) == 0
    assert "starts from random weights" in capsys.readouterr().err
    assert main(["train", "--resume", out, "--epochs", "2"]) == 0
    assert "starts from random weights" not in capsys.readouterr().err


def test_labels_the_model_has_no_output_for_are_refused_before_training(tmp_path, capsys):
    (tmp_path / "net.py").write_text("from torch import nn\n\ndef build():\n    return nn.Linear(4, 2)\n")
    torch.save({"x": torch.randn(40, 4), "y": torch.arange(40) % 3}, tmp_path / "data.pt")
    out = tmp_path / "run"
    code, _, err = run(
        capsys, *TRAIN, "--model", f"{tmp_path / 'net.py'}:build", "--data", str(tmp_path / "data.pt"),
        "--out", str(out),
    )  # fmt: skip
    assert code == 2 and len(err) == 1 and "scores 2 c" in err[0] and "give a model with 3 outputs" in err[0]
    assert not out.exists() and not (tmp_path / ".run.partial").exists()
