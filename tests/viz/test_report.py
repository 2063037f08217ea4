"""The run report: built from a run folder, then opened in headless Chromium (no network, no console
error, every image decodes, the findings and summary tables are there, the screenshot is not blank)."""

import json
import re
import shutil
import subprocess

import numpy as np
import pytest
from PIL import Image

from hookscope.cli import main
from hookscope.viz.report import write_report

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--enable-logging=stderr",
    "--v=0",
)

# Injected into a copy of the report (before the report's own script): records script errors, failed
# resources and console.error calls from the first moment, then writes the image sizes into the DOM.
PROBE = """<script>
window.__errors = [];
window.addEventListener("error", e => __errors.push(String(e.message || (e.target && e.target.src))), true);
const original = console.error;
console.error = (...args) => { __errors.push(args.join(" ")); original(...args); };
window.addEventListener("load", () => {
  const images = [...document.images].map(i => ({alt: i.alt, width: i.naturalWidth}));
  const out = document.createElement("pre");
  out.id = "probe";
  out.textContent = JSON.stringify({images, errors: __errors});
  document.body.appendChild(out);
});
</script>"""


def chromium_or_skip() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("chromium is not installed and `make browser` could not install it (needs apt-get as root)")


def chromium(tmp_path, *args):
    profile = tmp_path / "chromium-profile"
    argv = [chromium_or_skip(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A real one-epoch run with the doctor on, plus one finding so the findings table has rows."""
    out = tmp_path_factory.mktemp("report") / "run"
    assert main(["train", "--epochs", "1", "--out", str(out)]) == 0
    findings = json.loads((out / "findings.json").read_text())
    findings.append(
        {
            "kind": "dead_units",
            "module": "features.1.2",
            "step": 12,
            "severity": "warning",
            "message": "97% of units dead since step 12",
            "evidence": {},
        }
    )
    (out / "findings.json").write_text(json.dumps(findings))
    write_report(out)
    return out


@pytest.mark.browser
def test_report_loads_without_errors_and_every_image_decodes(run_dir, tmp_path):
    page = (run_dir / "report.html").read_text()
    probed = tmp_path / "probed.html"
    probed.write_text(page.replace("<head>", "<head>\n" + PROBE, 1))
    done = chromium(tmp_path, "--virtual-time-budget=10000", "--dump-dom", probed.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    probe = json.loads(re.search(r'<pre id="probe">(.*?)</pre>', done.stdout, re.S).group(1))
    assert probe["errors"] == []
    assert ":CONSOLE" not in done.stderr  # the page itself logs nothing: any console line is a problem
    assert len(probe["images"]) == len(re.findall(r"<img ", page)) >= 6  # the rest are charts
    assert [i["alt"] for i in probe["images"] if i["width"] == 0] == []


@pytest.mark.browser
def test_report_shows_the_findings_and_summary_tables(run_dir, tmp_path):
    done = chromium(tmp_path, "--dump-dom", (run_dir / "report.html").as_uri())
    dom = done.stdout
    findings = re.search(r'<table id="findings">.*?</table>', dom, re.S).group(0)
    assert (
        "97% of units dead since step 12" in findings and "features.1.2" in findings and "warning" in findings
    )
    summary = re.search(r'<table id="summary">.*?</table>', dom, re.S).group(0)
    assert summary.count("<tr>") >= 15 and "features.0.0" in summary and "Conv2d" in summary
    assert "56.55 k" in dom  # the parameter count card


@pytest.mark.browser
def test_report_screenshot_is_not_blank(run_dir, tmp_path):
    shot = tmp_path / "shot.png"
    done = chromium(
        tmp_path, "--window-size=1280,2000", f"--screenshot={shot}", (run_dir / "report.html").as_uri()
    )
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    rgb = np.asarray(Image.open(shot).convert("RGB"), dtype=np.float32)
    pixels = rgb.mean(axis=2)
    assert pixels.shape == (2000, 1280)
    assert pixels.std() > 10  # text, tables, charts and figures; a blank page is one flat colour (std 0)
    assert (pixels < 128).mean() > 0.005
    accent = np.abs(rgb - np.array([47, 111, 222])).sum(axis=2) < 60  # the loss and lr lines' blue
    assert accent.mean() > 0.0005  # the chart script ran and drew


def test_report_works_without_network_resources(run_dir):
    page = (run_dir / "report.html").read_text()
    assert not re.findall(r'(?:src|href)="(?:https?:)?//', page)
    assert not re.findall(r"<script[^>]*\bsrc=", page)  # the chart script is inline
    assert page.count('src="data:image/png;base64,') == len(re.findall(r"<img ", page))


def test_report_of_a_partial_folder_explains_what_is_missing(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"name": "bare", "options": {"doctor": False}}))
    report = write_report(tmp_path).read_text()
    assert "Not recorded: the run used --no-doctor" in report
    assert "The doctor was off for this run." in report
    assert report.count('class="note"') >= 5
    assert "unfinished run" not in report


def test_report_explains_missing_feature_maps_of_a_model_without_convs(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"name": "mlp", "options": {}}))
    rows = [{"layer": "0", "type": "Linear", "output_shape": "1×10", "params": 650, "MACs": 640}]
    (tmp_path / "summary.json").write_text(json.dumps({"total_params": 650, "rows": rows}))
    assert "The model has no Conv2d layer" in write_report(tmp_path).read_text()


def test_report_of_an_interrupted_run_says_it_is_unfinished(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"name": "x", "status": "running", "options": {}}))
    assert "unfinished run" in write_report(tmp_path).read_text()


def test_a_causes_symptoms_are_shown_nested_under_it(tmp_path):
    from hookscope.doctor.finding_log import FindingLog
    from hookscope.doctor.findings import Finding, ranked

    log = FindingLog(quiet=True)
    log.add([Finding("loss_divergence", "", 5, "error", "the loss diverged")])
    log.add([Finding("stale_gradients", "", 1, "error", "zero_grad is missing")])
    (tmp_path / "findings.json").write_text(json.dumps([f.to_dict() for f in ranked(log.findings)]))
    page = write_report(tmp_path).read_text()
    cause, symptom = page.index("zero_grad is missing"), page.index("the loss diverged")
    assert cause < symptom
    assert "explained by <code>stale_gradients</code> above:</span> the loss diverged" in page


def test_past_the_first_twenty_findings_the_evidence_plot_is_named_not_embedded(tmp_path):
    """A model with a hundred findings would otherwise weigh over 10 MB of inline PNGs."""
    from hookscope.viz.report import EMBEDDED_EVIDENCE

    count = EMBEDDED_EVIDENCE + 5
    finding = {"kind": "dead_units", "severity": "warning", "message": "units are dead"}
    findings = [dict(finding, module=f"fc{i}", step=i) for i in range(count)]
    (tmp_path / "findings.json").write_text(json.dumps(findings))
    (tmp_path / "figures").mkdir()
    for i in range(count):
        Image.fromarray(np.full((8, 8, 3), 200, np.uint8)).save(tmp_path / "figures" / f"finding_{i:02d}.png")
    page = write_report(tmp_path).read_text()
    assert page.count("<img ") == EMBEDDED_EVIDENCE
    assert f"(plot: <code>figures/finding_{count - 1:02d}.png</code>)" in page
    assert "finding_00.png</code>" not in page
