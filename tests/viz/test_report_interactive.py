"""The interactive charts of report.html and compare.html, driven in headless Chromium through the DevTools
protocol: real mouse events hover a line (the tooltip shows the step and value), drag across a plot (the
x range shrinks), tick a layer in the filter (the series shown change). The page must raise no error."""

import base64
import contextlib
import json
import shutil
import subprocess
import time
import urllib.request

import pytest

from hookscope.cli import main
from hookscope.viz.compare_runs import compare_runs
from hookscope.viz.report import write_report

websockets_client = pytest.importorskip("websockets.sync.client")

pytestmark = pytest.mark.browser

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--remote-debugging-port=0",
    "--window-size=1280,1600",
)

# Evaluated in the page once it loaded: where things are, and what a chart shows (read from the page).
PROBE = """
window.probe = {
  chart: i => document.querySelectorAll(".hs-chart")[i],
  box: e => {
    e.scrollIntoView({block: "center"});
    const r = e.getBoundingClientRect();
    return {x: r.x, y: r.y, width: r.width, height: r.height};
  },
  state: i => {
    const c = probe.chart(i);
    const paths = [...c.querySelectorAll("path.hs-line")];
    const lines = paths.map(p => p.dataset.name), dashes = paths.map(p => p.getAttribute("stroke-dasharray"));
    return {...c.dataset, lines, dashes, title: c.querySelector(".hs-title").textContent};
  },
  frame: i => probe.box(probe.chart(i).querySelector(".hs-frame")),
  point: (i, name, k) => {  // point k of the line named name, in page coordinates
    const c = probe.chart(i);
    c.scrollIntoView({block: "center"});
    const line = [...c.querySelectorAll("path.hs-line")].find(p => p.dataset.name === name);
    const [x, y] = line.getAttribute("d").slice(1).split(/[ML]/)[k].split(",").map(Number);
    const p = new DOMPoint(x, y).matrixTransform(c.querySelector("svg").getScreenCTM());
    return [p.x, p.y];
  },
};
"""


class Browser:
    """Headless Chromium with one page, driven over the DevTools protocol (a websocket)."""

    def __init__(self, profile):
        chromium = next(
            (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)),
            None,
        )
        if chromium is None:
            pytest.skip("chromium is not installed (make browser installs it)")
        argv = [chromium, *FLAGS, f"--user-data-dir={profile}", "about:blank"]
        self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            port = self._port(profile / "DevToolsActivePort")
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30) as answer:
                target = next(t for t in json.load(answer) if t["type"] == "page")
            self.closing = contextlib.ExitStack()
            self.socket = self.closing.enter_context(
                websockets_client.connect(target["webSocketDebuggerUrl"], max_size=None)
            )
        except BaseException:  # no chromium left behind when it cannot be driven
            self.process.kill()
            self.process.wait(timeout=30)
            raise
        self.next_id, self.events = 0, []
        self.send("Runtime.enable")
        self.send("Page.enable")

    def _port(self, file):
        """Chromium writes the port it listens on into the profile once it is up."""
        for _ in range(600):
            if file.is_file() and file.read_text().strip():
                return int(file.read_text().split()[0])
            if self.process.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.process.returncode}")
            time.sleep(0.1)
        raise RuntimeError("chromium did not open its DevTools port")

    def send(self, method, **params):
        self.next_id += 1
        self.socket.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv(timeout=60))
            if message.get("id") == self.next_id:
                assert "error" not in message, message
                return message["result"]
            self.events.append(message)

    def open(self, path):
        self.send("Page.navigate", url=path.as_uri())
        for _ in range(600):
            if self.eval("document.readyState") == "complete":
                self.eval(PROBE)
                return
            time.sleep(0.1)
        raise RuntimeError(f"{path} did not finish loading")

    def eval(self, expression):
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def mouse(self, kind, x, y, pressed=False):
        buttons = {"button": "left", "buttons": 1, "clickCount": 1} if pressed or kind != "mouseMoved" else {}
        self.send("Input.dispatchMouseEvent", type=kind, x=x, y=y, **buttons)

    def box(self, selector):
        """The page coordinates of ``selector``'s element, scrolled into view."""
        return self.eval(f"probe.box(document.querySelector({json.dumps(selector)}))")

    def click(self, selector):
        """A real click (press and release) in the middle of ``selector``'s element."""
        box = self.box(selector)
        x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
        self.mouse("mousePressed", x, y, pressed=True)
        self.mouse("mouseReleased", x, y, pressed=True)

    def errors(self):
        """Exceptions and console errors the page raised."""
        thrown = [e for e in self.events if e.get("method") == "Runtime.exceptionThrown"]
        logged = [
            e
            for e in self.events
            if e.get("method") == "Runtime.consoleAPICalled" and e["params"]["type"] in ("error", "warning")
        ]
        return thrown + logged

    def screenshot(self, path):
        data = self.send("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))

    def close(self):
        self.closing.close()
        self.process.terminate()
        self.process.wait(timeout=30)


@pytest.fixture
def browser(tmp_path):
    chrome = Browser(tmp_path / "profile")
    yield chrome
    chrome.close()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A real one-epoch demo run (doctor on), with one finding on a layer deep in the model."""
    out = tmp_path_factory.mktemp("interactive") / "run"
    assert main(["train", "--epochs", "1", "--out", str(out)]) == 0
    finding = {"kind": "dead_units", "module": "features.3.2", "step": 12, "severity": "warning"}
    (out / "findings.json").write_text(json.dumps([{**finding, "message": "dead", "evidence": {}}]))
    write_report(out)
    return out


def chart_state(browser, index):
    return browser.eval(f"probe.state({index})")


def chart_index(browser, title):
    titles = browser.eval("[...document.querySelectorAll('.hs-chart .hs-title')].map(t => t.textContent)")
    return titles.index(title)


def plot_point(browser, index, fx, fy):
    """Page coordinates of the point at fractions (fx, fy) of chart ``index``'s plot area."""
    frame = browser.eval(f"probe.frame({index})")
    return frame["x"] + fx * frame["width"], frame["y"] + fy * frame["height"]


def point_of(browser, index, series, i):
    """Page coordinates of point ``i`` of the line named ``series`` in chart ``index`` (from its path)."""
    return browser.eval(f"probe.point({index}, {json.dumps(series)}, {i})")


def test_hovering_the_loss_shows_the_step_and_its_value(run_dir, browser):
    loss = json.loads((run_dir / "history.json").read_text())["loss"]
    browser.open(run_dir / "report.html")
    chart = chart_index(browser, "Loss")
    assert browser.eval(f"getComputedStyle(document.querySelectorAll('.hs-tip')[{chart}]).display") == "none"
    x, y = point_of(browser, chart, "train (step)", 9)
    browser.mouse("mouseMoved", x, y)
    tip = browser.eval(f"document.querySelectorAll('.hs-tip')[{chart}].innerText")
    name, value = tip.split("\n")
    assert name == "train (step)" and value.startswith(f"training step {loss['step'][9]}: ")
    assert float(value.rpartition(": ")[2]) == pytest.approx(loss["value"][9], rel=1e-3)
    assert browser.errors() == []


def test_dragging_across_a_plot_zooms_on_x_and_double_click_resets(run_dir, browser):
    browser.open(run_dir / "report.html")
    chart = chart_index(browser, "Loss")
    before = chart_state(browser, chart)
    full = float(before["xMax"]) - float(before["xMin"])
    start, end = plot_point(browser, chart, 0.2, 0.5), plot_point(browser, chart, 0.6, 0.5)
    browser.mouse("mousePressed", *start, pressed=True)
    browser.mouse("mouseMoved", *end, pressed=True)
    browser.mouse("mouseReleased", *end, pressed=True)
    zoomed = chart_state(browser, chart)
    assert float(zoomed["xMin"]) == pytest.approx(float(before["xMin"]) + 0.2 * full, rel=0.05)
    assert float(zoomed["xMax"]) == pytest.approx(float(before["xMin"]) + 0.6 * full, rel=0.05)
    assert browser.eval(f"document.querySelectorAll('.hs-reset')[{chart}].hidden") is False
    x, y = plot_point(browser, chart, 0.5, 0.5)
    browser.send("Input.dispatchMouseEvent", type="mousePressed", x=x, y=y, button="left", clickCount=2)
    browser.send("Input.dispatchMouseEvent", type="mouseReleased", x=x, y=y, button="left", clickCount=2)
    reset = chart_state(browser, chart)
    assert (reset["xMin"], reset["xMax"]) == (before["xMin"], before["xMax"])
    assert browser.errors() == []


def test_ticking_a_layer_shows_its_series_in_every_chart_of_the_section(run_dir, browser):
    layers = list(json.loads((run_dir / "history.json").read_text())["activations"])
    browser.open(run_dir / "report.html")
    mean, std = chart_index(browser, "Mean"), chart_index(browser, "Standard deviation")
    shown = chart_state(browser, mean)["lines"]
    assert "features.3.2" in shown  # the layer a finding names is ticked
    assert len(shown) == 8 and set(shown) < set(layers)  # 8 of the layers at first, in model order
    hidden = next(layer for layer in layers if layer not in shown)
    browser.click(f'.hs-filter input[value="{hidden}"]')
    for chart in (mean, std):
        after = chart_state(browser, chart)["lines"]
        assert set(after) == {*shown, hidden} and after == [n for n in layers if n in after]
    count = browser.eval("document.querySelector('.hs-filter .hs-count').textContent")
    assert count == f"9 of {len(layers)} layers shown"
    assert browser.errors() == []


@pytest.fixture(scope="module")
def compare_page(run_dir):
    """compare.html of the demo run and a second one with another seed."""
    other = run_dir.parent / "seed1"
    assert main(["train", "--epochs", "1", "--seed", "1", "--out", str(other)]) == 0
    return compare_runs(run_dir, other, out=run_dir.parent / "compare").page, other


def test_compare_page_hover_shows_run_b_value(compare_page, browser):
    page, other = compare_page
    rows = [json.loads(line) for line in (other / "metrics.jsonl").read_text().splitlines()]
    first = next(r for r in rows if r["kind"] == "step")
    browser.open(page)
    chart = chart_index(browser, "Loss")
    browser.mouse("mouseMoved", *point_of(browser, chart, "B train", 0))
    tip = browser.eval(f"document.querySelectorAll('.hs-tip')[{chart}].innerText")
    name, value = tip.split("\n")
    assert name == "B train" and value.startswith(f"training step {first['step']}: ")
    assert float(value.rpartition(": ")[2]) == pytest.approx(first["train_loss"], rel=1e-3)
    assert browser.errors() == []


def test_compare_page_layer_filter_shows_both_runs_of_a_layer(compare_page, browser):
    page, _ = compare_page
    browser.open(page)
    mean = chart_index(browser, "Activations mean")
    assert "A: features.0.0" in chart_state(browser, mean)["lines"]  # the runs part there first: ticked
    assert browser.eval("document.querySelector('.hs-filter button:nth-of-type(2)').textContent") == "none"
    browser.click(".hs-filter button:nth-of-type(2)")
    assert chart_state(browser, mean)["lines"] == [] and chart_state(browser, mean)["shown"] == "0"
    browser.click('.hs-filter input[value="features.2"]')
    state = chart_state(browser, mean)
    assert state["lines"] == ["A: features.2", "B: features.2"] and state["dashes"] == [None, "6 4"]
    assert browser.errors() == []
