"""``hookscope compare RUN_A RUN_B``: two demo runs (one epoch of the digits CNN) side by side in
compare.html, opened in headless Chromium."""

import shutil
import subprocess

import numpy as np
import pytest
from PIL import Image

from hookscope.cli import main

TRAIN = ("train", "--epochs", "1", "--batch-size", "128")
CHROMIUM = ("chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run")


@pytest.fixture(scope="module")
def demo_runs(tmp_path_factory):
    """Three one-epoch demo runs: seed 0, seed 1, and seed 0 again."""
    root = tmp_path_factory.mktemp("demo")
    for name, seed in (("seed0", "0"), ("seed1", "1"), ("seed0-again", "0")):
        assert main([*TRAIN, "--seed", seed, "--out", str(root / name)]) == 0
    return root


def test_two_seeds_part_and_the_page_says_where(demo_runs, tmp_path, capsys):
    capsys.readouterr()
    assert main(["compare", str(demo_runs / "seed0"), str(demo_runs / "seed1"), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"compare.html: {tmp_path / 'compare.html'}"
    # different seeds: different initial weights, so the first recorded step already differs
    assert out[1].startswith("Runs `seed0` and `seed1` part at step 0, in the ")
    assert "Their configs differ in options.seed." in out[1]
    page = (tmp_path / "compare.html").read_text()
    assert "part at step 0" in page and "<code>options.seed</code>" in page
    assert '<table id="layers">' in page and "features.0.0" in page


def test_the_same_seed_twice_is_identical(demo_runs, tmp_path, capsys):
    capsys.readouterr()
    runs = [str(demo_runs / "seed0"), str(demo_runs / "seed0-again")]
    assert main(["compare", *runs, "--out", str(tmp_path)]) == 0
    assert "Runs `seed0` and `seed0-again` are identical" in capsys.readouterr().out
    assert "No per-layer statistic parts beyond its noise." in (tmp_path / "compare.html").read_text()


def test_a_folder_that_is_not_a_run_is_a_usage_error(demo_runs, tmp_path, capsys):
    assert main(["compare", str(demo_runs / "seed0"), str(tmp_path)]) == 2
    assert f"{tmp_path} is not a hookscope run folder" in capsys.readouterr().err


@pytest.mark.browser
def test_the_page_renders_in_chromium(demo_runs, tmp_path):
    if shutil.which(CHROMIUM[0]) is None:
        pytest.skip("chromium is not installed (make browser installs it)")
    assert main(["compare", str(demo_runs / "seed0"), str(demo_runs / "seed1"), "--out", str(tmp_path)]) == 0
    page = (tmp_path / "compare.html").as_uri()
    profile = f"--user-data-dir={tmp_path / 'profile'}"
    dump = [*CHROMIUM, profile, "--dump-dom", page]
    dom = subprocess.run(dump, capture_output=True, text=True, timeout=120)
    assert 'id="verdict"' in dom.stdout and "part at step 0" in dom.stdout
    shot = tmp_path / "shot.png"
    done = subprocess.run(
        [*CHROMIUM, profile, "--window-size=1280,1800", f"--screenshot={shot}", page],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    pixels = np.asarray(Image.open(shot).convert("L"), dtype=np.float32)
    assert pixels.std() > 20 and (pixels < 128).mean() > 0.01  # text, tables and figures, not a blank page
