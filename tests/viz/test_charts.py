"""The chart pieces of the report pages: the inline JSON of a chart, thinning, the layers a filter ticks,
history.json written by a real fit, the report sections that use them, and the script shipped as package
data (found through importlib.resources, and inside a built wheel)."""

import itertools
import json
import math
import re
import shutil
import subprocess
import sys
import zipfile
from importlib import resources
from pathlib import Path

import pytest
import torch
from torch import nn

import hookscope as hs
from hookscope.run_history import MAX_POINTS, keep, read_history
from hookscope.testing import synth_dbunch, synth_learner
from hookscope.viz.charts import CHART_VALUES, Series, chart_html, layer_filter_html, page_head, preselect
from hookscope.viz.report import write_report

ROOT = Path(__file__).resolve().parents[2]


def spec_of(markup):
    """The JSON a chart or filter element carries."""
    return json.loads(re.search(r'<script type="application/json">(.*?)</script>', markup, re.S).group(1))


def test_a_chart_carries_its_series_as_json_with_shared_steps():
    markup = chart_html(
        "Mean",
        [
            Series("conv1", [0, 10, 20], [0.5, 0.25, 0.125], layer="conv1"),
            Series("fc", [0, 10, 20], [1, 2, 3]),
        ],
        y_label="mean",
        group="activations",
    )
    spec = spec_of(markup)
    assert spec["title"] == "Mean" and spec["group"] == "activations" and spec["y_label"] == "mean"
    assert spec["xs"] == [[0, 10, 20]]  # both series were recorded at the same steps: one x array
    assert spec["series"][0] == {"name": "conv1", "x": 0, "y": [0.5, 0.25, 0.125], "layer": "conv1"}
    assert spec["series"][1]["y"] == [1, 2, 3] and "layer" not in spec["series"][1]


def test_markup_in_a_name_cannot_end_the_json_block_and_non_finite_values_stay_readable():
    name = "</script><script>alert(1)</script>"
    markup = chart_html("t", [Series(name, [1, 2, 3], [math.nan, math.inf, 1.23456789])])
    assert markup.count("</script>") == 1 and "<script>alert" not in markup
    series = spec_of(markup)["series"][0]
    assert series["name"] == name  # the JSON still says what the user named it
    assert series["y"] == ["nan", "inf", 1.2346]  # JSON has no NaN; 5 significant digits


def test_log_axis_when_positive_values_span_decades():
    assert spec_of(chart_html("t", [Series("a", [1, 2], [1e-4, 1e-1])]))["log"] is True
    assert spec_of(chart_html("t", [Series("a", [1, 2], [0.5, 2.0])]))["log"] is False
    assert spec_of(chart_html("t", [Series("a", [1, 2], [-1.0, 100.0])]))["log"] is False
    assert spec_of(chart_html("t", [Series("a", [1, 2], [0.5, 2.0])], log=True))["log"] is True


def test_thinning_keeps_the_first_and_last_point_evenly_spaced():
    kept = keep(1999, 500)
    assert len(kept) <= 500 and kept[0] == 0 and kept[-1] == 1998
    assert len({b - a for a, b in itertools.pairwise(kept[:-1])}) == 1
    assert keep(7, 500) == list(range(7))
    steps = list(range(2000))
    spec = spec_of(chart_html("t", [Series("loss", steps, [float(s) for s in steps])]))
    assert len(spec["xs"][0]) <= MAX_POINTS and spec["xs"][0][-1] == 1999


def test_many_series_share_the_values_a_chart_may_carry():
    series = [Series(f"layer{i}", range(500), [1.0] * 500, layer=f"layer{i}") for i in range(150)]
    spec = spec_of(chart_html("t", series))
    assert sum(len(s["y"]) for s in spec["series"]) <= CHART_VALUES
    assert all(len(s["y"]) >= 100 for s in spec["series"])


def test_preselect_ticks_the_named_layers_then_spreads_over_the_depth():
    layers = [f"block{i}" for i in range(150)]
    chosen = preselect(layers, first=["block77", "not-a-layer", "block77"], k=8)
    assert chosen[0] == "block77" and len(chosen) == 8 and len(set(chosen)) == 8
    assert "block0" in chosen and "block149" in chosen  # first and last blocks show
    many = preselect(layers, first=[f"block{i}" for i in range(40, 60)], k=8)
    assert many[:4] == ["block40", "block41", "block42", "block43"]  # half for the named layers
    assert many[4] == "block0" and many[-1] == "block149"
    assert preselect(["a", "b"], k=8) == ["a", "b"]


def test_a_filter_carries_its_layers_in_order_and_only_known_ones_ticked():
    spec = spec_of(layer_filter_html("g", ["a", "b", "c"], ["c", "zz"]))
    assert spec == {"group": "g", "layers": ["a", "b", "c"], "shown": ["c"]}


def test_the_script_and_style_are_package_data_inlined_in_the_head():
    static = resources.files("hookscope.viz") / "static"
    script = (static / "charts.js").read_text(encoding="utf-8")
    assert "class Chart" in script and "</script" not in script.lower()
    head = page_head()
    assert head.startswith("<style>") and script in head
    assert "fetch(" not in script and "XMLHttpRequest" not in script
    assert re.findall(r"https?://[^\s\"']+", script) == ["http://www.w3.org/2000/svg"]  # a name, not fetched


@pytest.mark.slow
def test_a_built_wheel_carries_the_chart_script(tmp_path):
    """A non-editable install gets what the wheel holds: the static folder must be in it."""
    source = tmp_path / "source"
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).is_file():
            shutil.copy(ROOT / name, source / name)
    argv = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        str(tmp_path),
        ".",
    ]
    done = subprocess.run(argv, cwd=source, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    names = zipfile.ZipFile(next(tmp_path.glob("hookscope-*.whl"))).namelist()
    assert {"hookscope/viz/static/charts.js", "hookscope/viz/static/charts.css"} <= set(names)


@pytest.fixture(scope="module")
def fitted_run(tmp_path_factory):
    """A real fit of a small MLP with the doctor recording every step, written by RunFolder."""
    out = tmp_path_factory.mktemp("charts") / "run"
    model = nn.Sequential(nn.Linear(1, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    cbs = [hs.callbacks.Doctor(every=1, quiet=True), hs.callbacks.RunFolder(out, metrics_every=5)]
    learn = synth_learner(data=synth_dbunch(n_train=12, n_valid=2), model=model, progress=False, cbs=cbs)
    learn.fit(2)
    return out, learn


def test_the_run_folder_writes_the_history_the_charts_draw(fitted_run):
    out, learn = fitted_run
    history = read_history(out)
    assert history["loss"]["step"] == list(range(1, 25))
    assert history["loss"]["value"] == pytest.approx(learn.recorder.losses, rel=1e-4)
    assert history["lr"]["value"] == pytest.approx(learn.recorder.lrs, rel=1e-4)
    recorded = learn.doctor.engine.activations.history
    assert list(history["activations"]) == [name for name, records in recorded.items() if records]
    first = history["activations"]["0"]
    assert first["step"] == [r.step for r in recorded["0"]]
    assert first["std"] == pytest.approx([r.stats.std for r in recorded["0"]], rel=1e-4)
    params = learn.doctor.engine.gradients.param_history
    norms = [
        math.hypot(w.grad_norm, b.grad_norm)
        for w, b in zip(params["2.weight"], params["2.bias"], strict=True)
    ]
    assert list(history["gradients"]) == ["0", "2", "4"]  # one entry per layer, its parameters together
    assert history["gradients"]["2"]["norm"] == pytest.approx(norms, rel=1e-4)


def test_the_report_draws_charts_where_there_is_data_and_keeps_other_figures(fitted_run):
    out, _ = fitted_run
    page = write_report(out).read_text()
    titles = [spec_of(c)["title"] for c in re.findall(r'<div class="hs-chart">.*?</div>', page, re.S)]
    # no metric in this fit: no metrics chart
    assert titles == [
        "Loss",
        "Learning rate",
        "Mean",
        "Standard deviation",
        "Dead units",
        "Gradient norm",
        "Update / weight ratio",
    ]
    assert 'alt="Loss per training step' not in page  # the chart replaced the figure of the same data
    assert 'alt="Gradient norm per layer' in page  # the per-layer overview stays a figure
    assert re.search(r"<head>.*<script>.*class Chart.*</script>.*</head>", page, re.S)


def test_a_report_without_history_keeps_its_figures(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"name": "old", "options": {}}))
    page = write_report(tmp_path).read_text()
    assert "hs-chart" not in page and "<script" not in page


def test_a_watched_loop_writes_the_history_of_its_logged_losses(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    logged = []
    with hs.watch(model, opt, quiet=True, path=tmp_path / "run") as w:
        for _ in range(6):
            x, y = torch.randn(16, 4), torch.randint(0, 2, (16,))
            loss = nn.functional.cross_entropy(model(x), y)
            w.log(loss)
            logged.append(loss.item())
            loss.backward()
            opt.step()
            opt.zero_grad()
    history = read_history(tmp_path / "run")
    assert history["loss"]["step"] == [1, 2, 3, 4, 5, 6]
    assert history["loss"]["value"] == pytest.approx(logged, rel=1e-4)
    assert "lr" not in history and {"0", "2"} <= set(history["gradients"])
    page = (tmp_path / "run" / "report.html").read_text()
    assert '"title":"Loss"' in page and '"title":"Gradient norm"' in page
