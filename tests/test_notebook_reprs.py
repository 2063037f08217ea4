"""What a notebook shows for hookscope's results: the ``_repr_html_`` of a summary, findings, the history
and a run folder — real tables with the values, every name and message escaped."""

import html
import re
import shlex
import sys

import pytest
import torch
from torch import nn

import hookscope as hs
from hookscope.callbacks.run_folder import process_command
from hookscope.doctor.finding_log import print_line
from hookscope.doctor.findings import Finding, Findings
from hookscope.run_reader import Run
from hookscope.testing import synth_learner


def _cells(page: str) -> list[list[str]]:
    """The text of every ``<td>`` of every row, unescaped (what the reader sees)."""
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", page, flags=re.S)
    return [[html.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, flags=re.S)] for row in rows]


class Tagged(nn.Module):
    """A model whose child is named like markup: the name must show as written, never as a tag."""

    def __init__(self) -> None:
        super().__init__()
        self.add_module("<b>&x", nn.Linear(4, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self, "<b>&x")(x)


def test_the_summary_shows_its_rows_and_totals_as_a_table():
    s = hs.summary(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), input_size=(1, 4))
    page = s._repr_html_()
    rows = [r for r in _cells(page) if r]
    assert [r[0].strip("\u00a0") for r in rows] == [
        "(model) (Sequential)",
        "0 (Linear)",
        "1 (ReLU)",
        "2 (Linear)",
    ]
    assert rows[1][1:] == ["[1, 4]", "[1, 8]", "40", "32"]
    assert rows[1][0].startswith("\u00a0\u00a0")  # the depth indent survives HTML's collapsing of spaces
    assert f"Total params: {s.total_params:,}" in page and "Sequential summary" in page


def test_markup_in_a_module_name_is_shown_as_written():
    page = hs.summary(Tagged(), input_size=(1, 4))._repr_html_()
    assert "<b>&x" not in page and "&lt;b&gt;&amp;x" in page
    assert any("<b>&x (Linear)" in cell for row in _cells(page) for cell in row)


def test_a_failed_forward_marks_the_failing_row_in_red():
    broken = nn.Sequential(nn.Flatten(), nn.Linear(400, 10))
    try:
        hs.summary(broken, input_size=(1, 16, 4, 4))
    except RuntimeError as err:
        page = err.summary._repr_html_()
    red = re.findall(r'<tr style="color:#c92a2a">(.*?)</tr>', page)
    assert len(red) == 2  # the model's forward failed too, inside which '1' failed
    assert "(model) (Sequential)" in red[0] and "1 (Linear)" in red[1] and "✗ failed" in red[1]
    assert "Forward failed in: &#x27;1&#x27;" in page


def _finding(kind, module, step, severity, message="m", **kw):
    return Finding(kind, module, step, severity, message, **kw)


def test_findings_show_most_severe_first_and_each_symptom_under_its_cause():
    found = Findings(
        [
            _finding("plateau", "", 30, "warning"),
            _finding("dead_units", "features.<3>", 5, "info", "97% <dead> & gone"),
            _finding("stale_gradients", "", 40, "error", explains=(("plateau", ""),)),
        ]
    )
    rows = [r for r in _cells(found._repr_html_()) if r]
    assert [(r[0], r[1]) for r in rows] == [
        ("error", "stale_gradients"),
        ("warning", "↳ plateau"),
        ("info", "dead_units"),
    ]
    assert rows[2][2:] == ["features.<3>", "5", "97% <dead> & gone"]
    assert "<dead>" not in found._repr_html_()
    assert [f.kind for f in found] == ["plateau", "dead_units", "stale_gradients"]  # the list keeps its order


def test_one_finding_shows_its_row_and_evidence():
    page = _finding(
        "dead_units", "2", 0, "warning", evidence={"fraction": 0.96875, "units": 64}
    )._repr_html_()
    cells = [r for r in _cells(page) if r]
    assert cells == [["warning", "dead_units", "2", "0", "m"], ["fraction", "0.9688"], ["units", "64"]]


def test_the_doctor_keeps_findings_that_show_as_a_table_and_stay_a_list():
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    with torch.no_grad():
        model[1].bias.fill_(-10.0)  # every unit of the ReLU dead
    x, y = torch.randn(256, 64), torch.randint(0, 10, (256,))
    dls = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32)
    learn = hs.Learner(
        model, (dls, None), nn.CrossEntropyLoss(), cbs=[hs.callbacks.Doctor(quiet=True)], progress=False
    )
    learn.fit(1)
    findings = learn.doctor.findings
    assert isinstance(findings, list) and isinstance(findings, Findings)
    assert ["dead_units", "2"] in [r[1:3] for r in _cells(findings._repr_html_())]
    assert Findings()._repr_html_() == "<p>Doctor: no finding.</p>"


def test_the_history_shows_one_row_per_epoch():
    learn = synth_learner(n_trn=4, progress=False)
    learn.fit(2)
    history = learn.recorder.history
    assert isinstance(history, list) and len(history) == 2
    page = learn.recorder._repr_html_()
    header = re.findall(r"<th style=[^>]*>(.*?)</th>", page)
    assert header == list(history[0])
    rows = [r for r in _cells(page) if r]
    assert [r[0] for r in rows] == ["0", "1"]
    assert rows[1][header.index("train_loss")] == f"{history[1]['train_loss']:.4f}"
    learn.recorder.load_state_dict(learn.recorder.state_dict())  # a resumed history shows the same way
    assert learn.recorder._repr_html_() == page


def test_a_run_folder_shows_its_findings_and_its_report_inline(tmp_path):
    learn = synth_learner(
        n_trn=4,
        progress=False,
        cbs=[hs.callbacks.Doctor(quiet=True), hs.callbacks.RunFolder(tmp_path / "run", figures=False)],
    )
    before = learn.run_folder._repr_html_()
    assert "No run folder yet" in before
    learn.fit(1)
    run = Run(tmp_path / "run")
    page = learn.run_folder._repr_html_()
    assert page == run._repr_html_()
    frame = re.search(r'<iframe srcdoc="([^"]*)"', page)
    assert frame and html.unescape(frame.group(1)) == run.report.read_text(encoding="utf-8")
    assert "complete" in page and run.config["status"] == "complete"
    assert repr(run) == f"Run({str(tmp_path / 'run')!r}, complete, {len(run.findings)} findings)"
    assert [r["kind"] for r in run.metrics][-1] == "epoch"


def test_a_watch_folder_reads_back_as_a_run(tmp_path):
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with hs.watch(model, opt, quiet=True, path=tmp_path / "w") as w:
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(8, 4)).sum().backward()
            opt.step()
    run = Run(tmp_path / "w")
    assert run.findings == w.findings and run.config["source"] == "hs.watch"
    assert "<iframe srcdoc=" in run._repr_html_()


def test_a_run_of_a_path_that_is_no_folder_says_what_to_pass(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a folder; pass a run folder written by"):
        Run(tmp_path / "nothing")


def test_preflight_returns_findings_that_show_as_a_table():
    x, y = torch.randn(64, 8), torch.randint(0, 3, (64,))
    train = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    found = hs.preflight(model, (train, train), nn.CrossEntropyLoss(), steps=5)  # valid = train: overlap
    assert isinstance(found, Findings)
    assert "train_valid_overlap" in [r[1] for r in _cells(found._repr_html_()) if r]


def test_a_watch_without_the_engine_shows_no_finding():
    model = nn.Sequential(nn.Linear(4, 2))
    with hs.watch(model, doctor=False, stats=False, guard=True) as w:
        assert isinstance(w.findings, Findings) and w.findings == []
        assert w.findings._repr_html_() == "<p>Doctor: no finding.</p>"


@pytest.mark.parametrize(
    ("env", "coloured"),
    [({}, False), ({"FORCE_COLOR": "1"}, True), ({"FORCE_COLOR": "1", "TERM": "dumb"}, False)],
)
def test_the_doctor_colours_its_line_only_for_a_terminal(env, coloured, capsys, monkeypatch):
    """Outside a kernel rich decides as for any terminal program (stderr a tty, FORCE_COLOR, a dumb
    TERM); tests/examples/test_notebook.py checks the kernel's plain line."""
    for name in ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TERM"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    print_line("[warning] dead_units: layer `2`", "warning")
    line = capsys.readouterr().err
    assert ("\x1b[33m" in line) is coloured
    assert line.replace("\x1b[33m", "").replace("\x1b[0m", "") == "Doctor [warning] dead_units: layer `2`\n"


def test_the_run_folder_records_the_command_line_outside_a_kernel(monkeypatch):
    assert process_command() == shlex.join(["python", *sys.argv])
    monkeypatch.setattr(sys, "argv", [""])  # the interactive interpreter
    assert process_command() == "python (interactive)"
