"""examples/quickstart.ipynb runs top to bottom in a real Jupyter kernel and shows what the README says.

The notebook is executed on a copy in a temporary folder (its run folder is written there) by the same
function that stores its outputs (``examples/execute_notebook.py``); the committed notebook must hold
the outputs of such a run, so that it reads well on GitHub.
"""

import html
import importlib.util
import json
import re
import shutil
from pathlib import Path

import nbformat
import pytest

import hookscope as hs
from hookscope.models import digits_cnn

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NOTEBOOK = EXAMPLES / "quickstart.ipynb"


def _execute_notebook_module():
    spec = importlib.util.spec_from_file_location("execute_notebook", EXAMPLES / "execute_notebook.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _code_cells(notebook) -> list:
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def _cell(notebook, text: str):
    """The one code cell whose source is ``text`` or holds it."""
    (cell,) = [c for c in _code_cells(notebook) if c.source == text] or [
        c for c in _code_cells(notebook) if text in c.source
    ]
    return cell


def _data(cell, mime: str) -> list[str]:
    """Every output of ``cell`` of type ``mime`` (text/html, text/plain, image/png)."""
    return [o.data[mime] for o in cell.outputs if "data" in o and mime in o.data]


def _texts(notebook) -> list[str]:
    """Every stream text and every text-like output of every code cell."""
    outputs = [o for c in _code_cells(notebook) for o in c.outputs]
    data = [v for o in outputs for v in o.get("data", {}).values() if isinstance(v, str)]
    return [o.text for o in outputs if o.output_type == "stream"] + data


def _rows(page: str) -> list[list[str]]:
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", page, flags=re.S)
    return [[html.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, flags=re.S)] for row in rows]


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """The notebook executed in a fresh kernel (importing this hookscope), and the folder it ran in."""
    folder = tmp_path_factory.mktemp("notebook")
    shutil.copy(NOTEBOOK, folder / NOTEBOOK.name)
    return _execute_notebook_module().execute(folder / NOTEBOOK.name, folder), folder


@pytest.mark.slow
def test_every_cell_runs_and_the_capture_and_summary_show_the_readme_values(executed):
    notebook, _ = executed
    assert not [o for c in _code_cells(notebook) for o in c.outputs if o.output_type == "error"]
    capture = _cell(notebook, "model, x = resnet34")
    assert _data(capture, "text/plain") == ["(36, torch.Size([1, 64, 112, 112]))"]
    assert len(_data(_cell(notebook, "hs.viz.feature_maps"), "image/png")) == 1
    (table,) = _data(_cell(notebook, "hs.summary"), "text/html")
    expected = hs.summary(digits_cnn(), input_size=(1, 1, 8, 8))
    assert f"Total params: {expected.total_params:,}" in table
    assert len([r for r in _rows(table) if r]) == len(expected.rows)


@pytest.mark.slow
def test_the_doctor_names_the_dead_layer_in_the_learner_and_in_watch(executed):
    notebook, _ = executed
    (pair,) = _data(_cell(notebook, "learn.doctor.findings[0]"), "text/plain")
    assert pair == "('dead_units', '2')"  # the README: print(... .kind, ... .module) -> dead_units 2
    for cell in (_cell(notebook, "learn.doctor.findings"), _cell(notebook, "hs.watch(model, opt)")):
        tables = [page for page in _data(cell, "text/html") if "<table>" in page]
        assert ["warning", "dead_units", "2", "0"] in [r[:4] for t in tables for r in _rows(t)]


@pytest.mark.slow
def test_the_doctor_prints_its_line_as_plain_text_in_the_kernel(executed):
    notebook, _ = executed
    for cell in (_cell(notebook, "learn.fit(1)"), _cell(notebook, "hs.watch(model, opt)")):
        lines = [o.text for o in cell.outputs if o.output_type == "stream" and o.name == "stderr"]
        assert [line.startswith("Doctor [warning] dead_units: layer `2`") for line in lines] == [True]
    assert not [t for t in _texts(notebook) if "\x1b" in t]  # no terminal colour codes in any output


@pytest.mark.slow
def test_the_comparison_names_the_nudged_layer_and_the_op(executed):
    notebook, _ = executed
    cell = _cell(notebook, "hs.compare(model_a, model_b")
    assert "model_b.features[1][0].weight.mul_(1.01)" in cell.source
    (page,) = _data(cell, "text/html")
    paragraph = html.unescape(re.search(r"<p>(.*?)</p>", page, flags=re.S).group(1))
    assert paragraph.startswith("The models part in the forward pass at `features.1.0` (Conv2d)")
    assert "aten.convolution" in paragraph
    rows = [r for r in _rows(page) if r]
    assert [r[0] for r in rows if r[-1] == "<- first"] == ["features.1.0"]
    assert [r[-1] for r in rows if r[0] in ("features.0.0", "features.1.1")] == ["!", "!"]  # grads, outputs
    (text,) = _data(cell, "text/plain")
    assert text.startswith("Comparison(first_divergent='features.1.0', phase='forward'")


@pytest.mark.slow
def test_the_progress_bar_is_one_display_of_clean_text_and_html(executed):
    notebook, _ = executed
    fit = _cell(notebook, "learn.fit(1)")
    bars = [o for o in fit.outputs if "data" in o and "<progress" in o.data.get("text/html", "")]
    assert len(bars) == 1  # updated in place, not one output per refresh
    text = bars[0].data["text/plain"]
    assert "\r" not in text and "\x1b" not in text
    assert text.splitlines()[0].startswith("epoch 1  train_loss ") and "epochs  " in text and "1/1" in text
    assert not [o for o in fit.outputs if o.output_type == "stream" and "\r" in o.text]


@pytest.mark.slow
def test_the_history_and_the_run_folder_show_inline(executed):
    notebook, folder = executed
    (history,) = _data(_cell(notebook, "learn.recorder"), "text/html")
    assert [r[0] for r in _rows(history) if r] == ["0"]
    (run,) = _data(_cell(notebook, "learn.run_folder"), "text/html")
    frame = re.search(r'<iframe srcdoc="([^"]*)"', run)
    report = folder / "runs" / "quickstart" / "report.html"
    assert frame and html.unescape(frame.group(1)) == report.read_text(encoding="utf-8")
    config = json.loads((folder / "runs" / "quickstart" / "config.json").read_text(encoding="utf-8"))
    assert config["command"] == "notebook quickstart.ipynb"  # not the ipykernel launcher's command line
    # in a kernel rich would display the summary table instead of writing summary.txt
    assert "Total params: " in (folder / "runs" / "quickstart" / "summary.txt").read_text(encoding="utf-8")
    assert not [
        o for o in _cell(notebook, "learn.fit(1)").outputs if "Sequential summary" in str(o.get("data", ""))
    ]


def test_the_committed_notebook_holds_the_outputs_of_a_run_top_to_bottom():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    cells = _code_cells(notebook)
    assert [c.execution_count for c in cells] == list(range(1, len(cells) + 1))
    assert all(c.outputs for c in cells[1:])  # the first cell only imports
    assert not [o for c in cells for o in c.outputs if o.output_type == "error"]
    assert not [t for t in _texts(notebook) if "\x1b" in t]
    assert NOTEBOOK.stat().st_size < 1_000_000  # GitHub shows it; images drawn at a modest size
