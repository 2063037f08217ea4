"""Each doctor finding carries the plot of its evidence: the figures, and their place in report.html."""

import json
from functools import partial

import pytest
import torch
from faults import kinds, mlp, optimizer_without, train_with_doctor

from hookscope.callbacks import RunFolder
from hookscope.viz.evidence import evidence_figure

pytestmark = pytest.mark.usefixtures("deterministic")


def test_the_gradient_flow_marks_the_layer_left_out_of_the_optimizer(tmp_path):
    torch.manual_seed(0)
    model = mlp(depth=3)
    out = tmp_path / "run"
    learn = train_with_doctor(model, opt_func=optimizer_without(model[2]), steps=6, cbs=[RunFolder(out)])
    (finding,) = kinds(learn)["not_updated"]
    fig = evidence_figure(finding, learn.doctor.engine)
    ticks = fig.get_axes()[-1].get_xticklabels()
    marked = [t.get_text() for t in ticks if t.get_color() == "tab:red"]
    assert marked == ["2"] and [t.get_text() for t in ticks] == ["0", "2", "4"]

    findings = json.loads((out / "findings.json").read_text())
    index = next(i for i, f in enumerate(findings) if f["kind"] == "not_updated")
    assert (out / "figures" / f"finding_{index:02d}.png").is_file()
    report = (out / "report.html").read_text()
    table = report.split('id="findings"')[1].split("</table>")[0]
    assert table.count("<img") == len(list((out / "figures").glob("finding_*.png"))) >= 1
    assert "finding_" not in report.split('id="findings"')[0]  # not repeated among the other figures


def test_the_loss_curve_shades_the_oscillation_from_its_first_step():
    torch.manual_seed(0)
    sgd = partial(torch.optim.SGD, momentum=0.9)
    learn = train_with_doctor(mlp(depth=3), lr=0.5, opt_func=sgd, epochs=3, steps=60)
    (finding,) = kinds(learn)["oscillating_loss"]
    ax = evidence_figure(finding, learn.doctor.engine).get_axes()[0]
    (span,) = ax.patches
    assert span.get_x() == finding.step
    assert len(ax.lines[0].get_xdata()) == len(learn.doctor.engine.loss_history)


def test_dead_units_show_their_dead_fraction_and_frozen_has_no_figure():
    torch.manual_seed(0)
    model = mlp(depth=3)
    with torch.no_grad():
        model[2].bias.fill_(-10.0)
    model[0].requires_grad_(False)
    learn = train_with_doctor(model, steps=6)
    (dead,) = kinds(learn)["dead_units"]
    line = evidence_figure(dead, learn.doctor.engine).get_axes()[0].lines[0]
    assert list(line.get_ydata()) == [1.0] * len(line.get_ydata())
    (frozen,) = kinds(learn)["frozen"]
    assert evidence_figure(frozen, learn.doctor.engine) is None
