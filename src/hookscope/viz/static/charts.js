/* hookscope charts: line charts for report.html and compare.html, with no dependency and no network.
 *
 * Each chart element (class hs-chart) holds its spec as inline JSON (written by hookscope/viz/charts.py):
 *   {title, x_label, y_label, log, group, y_range, xs: [[steps...], ...],
 *    series: [{name, layer, x: index into xs, y: [values...], color, dash, markers}]}
 * A value that is not a number ("nan", "inf") breaks the line. Charts with the same group share one
 * layer filter, an element of class hs-filter holding {group, layers, shown}: ticking a layer shows its series.
 * Hover: the nearest point's series, step and value. Drag across the plot: zoom on x; double-click or
 * "reset zoom": the whole range again. "log y": a log axis, ticked at first when the values span decades.
 * The current state is mirrored in data- attributes (x-min, x-max, shown) for readers and tests.
 */
(function () {
  "use strict";

  const SVG = "http://www.w3.org/2000/svg";
  const PALETTE = ["#2f6fde", "#e0582b", "#2e9d5b", "#9b59b6", "#c0392b", "#16a2b8", "#8c6d31",
                   "#d6339b", "#5f6b7a", "#b8a200"];
  const BOX = {width: 720, height: 270, left: 66, right: 14, top: 10, bottom: 40};
  const MAX_LEGEND = 16;  // more visible series than this: the legend says how many instead
  const groups = {};  // group name -> {layers, shown: Set, preset: Set, charts: []}
  let made = 0;  // charts built so far: each clips its lines with its own clip path

  function svg(tag, attrs, parent) {
    const node = document.createElementNS(SVG, tag);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
    if (parent) parent.appendChild(node);
    return node;
  }

  function html(tag, className, parent, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    if (parent) parent.appendChild(node);
    return node;
  }

  function readSpec(root) {
    return JSON.parse(root.querySelector("script[type='application/json']").textContent);
  }

  function format(value) {
    if (typeof value !== "number") return String(value);
    const size = Math.abs(value);
    if (size !== 0 && (size < 1e-3 || size >= 1e5)) return value.toExponential(2).replace(/\.?0+e/, "e");
    return String(Number(value.toPrecision(4)));
  }

  function linearTicks(lo, hi, count) {
    const raw = (hi - lo) / count;
    const power = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map(m => m * power).find(s => s >= raw) || raw;
    const ticks = [];
    for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) ticks.push(Number(t.toPrecision(12)));
    return ticks;
  }

  function logTicks(lo, hi) {
    const ticks = [];
    for (let p = Math.ceil(Math.log10(lo)); p <= Math.floor(Math.log10(hi)); p++) ticks.push(Math.pow(10, p));
    return ticks.length >= 2 ? ticks : linearTicks(lo, hi, 4);
  }

  // The index of the first x >= value in an ascending array.
  function lowerBound(xs, value) {
    let lo = 0, hi = xs.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (xs[mid] < value) lo = mid + 1; else hi = mid;
    }
    return lo;
  }

  class Chart {
    constructor(root, spec) {
      this.root = root;
      this.spec = spec;
      this.series = spec.series.map((s, i) => ({...s, xs: spec.xs[s.x], color: s.color || null, index: i}));
      this.zoom = null;  // [x0, x1] while zoomed
      this.full = this.fullRange();
      this.positive = this.series.every(s => s.y.every(v => typeof v !== "number" || v > 0));
      this.log = Boolean(spec.log) && this.positive;
      this.build();
    }

    fullRange() {
      const xs = this.series.flatMap(s => s.xs.length ? [s.xs[0], s.xs[s.xs.length - 1]] : []);
      return xs.length ? [Math.min(...xs), Math.max(...xs)] : [0, 1];
    }

    build() {
      const bar = html("div", "hs-bar", this.root);
      html("span", "hs-title", bar, this.spec.title);
      if (this.positive) {
        const label = html("label", "hs-log", bar);
        const box = html("input", "", label);
        box.type = "checkbox";
        box.checked = this.log;
        box.addEventListener("change", () => { this.log = box.checked; this.render(); });
        label.append(" log y");
      }
      this.reset = html("button", "hs-reset", bar, "reset zoom");
      this.reset.type = "button";
      this.reset.addEventListener("click", () => this.setZoom(null));
      this.svg = svg("svg", {viewBox: `0 0 ${BOX.width} ${BOX.height}`, class: "hs-svg"}, this.root);
      const clip = `hs-clip-${made++}`;
      svg("rect", {x: BOX.left, y: BOX.top, width: this.plotWidth(), height: this.plotHeight()},
          svg("clipPath", {id: clip}, svg("defs", {}, this.svg)));
      this.axes = svg("g", {class: "hs-axes"}, this.svg);
      this.lines = svg("g", {class: "hs-lines", "clip-path": `url(#${clip})`}, this.svg);
      this.guide = svg("line", {class: "hs-guide", y1: BOX.top, y2: BOX.top + this.plotHeight()}, this.svg);
      this.dot = svg("circle", {class: "hs-dot", r: 4}, this.svg);
      this.brush = svg("rect", {class: "hs-brush", y: BOX.top, height: this.plotHeight()}, this.svg);
      this.tip = html("div", "hs-tip", this.root);
      this.legend = html("div", "hs-legend", this.root);
      this.listen();
    }

    plotWidth() { return BOX.width - BOX.left - BOX.right; }
    plotHeight() { return BOX.height - BOX.top - BOX.bottom; }

    visible() {
      const group = groups[this.spec.group];
      return this.series.filter(s => !s.layer || !group || group.shown.has(s.layer));
    }

    colorOf(s) {
      if (s.color) return s.color;
      const group = groups[this.spec.group];
      const at = group && s.layer ? group.layers.indexOf(s.layer) : s.index;
      return PALETTE[at % PALETTE.length];
    }

    usable(v) { return typeof v === "number" && (!this.log || v > 0); }

    yRange(shown, x0, x1) {
      let lo = Infinity, hi = -Infinity;
      for (const s of shown) {
        for (let i = lowerBound(s.xs, x0); i < s.xs.length && s.xs[i] <= x1; i++) {
          if (this.usable(s.y[i])) { lo = Math.min(lo, s.y[i]); hi = Math.max(hi, s.y[i]); }
        }
      }
      if (this.spec.y_range && !this.log) return this.spec.y_range;
      if (lo === Infinity) return this.log ? [0.1, 10] : [0, 1];
      if (this.log) return lo === hi ? [lo / 2, hi * 2] : [lo, hi];
      const pad = (hi - lo) * 0.05 || Math.abs(hi) * 0.05 || 1;
      return [lo - pad, hi + pad];
    }

    render() {
      const shown = this.visible();
      const [x0, x1] = this.zoom || this.full;
      const [y0, y1] = this.yRange(shown, x0, x1);
      const toLog = v => this.log ? Math.log10(v) : v;
      const spanX = (x1 - x0) || 1, spanY = (toLog(y1) - toLog(y0)) || 1;
      this.px = x => BOX.left + (x - x0) / spanX * this.plotWidth();
      this.py = y => BOX.top + this.plotHeight() - (toLog(y) - toLog(y0)) / spanY * this.plotHeight();
      this.fromPx = px => x0 + (px - BOX.left) / this.plotWidth() * spanX;
      this.drawAxes(x0, x1, y0, y1);
      this.lines.replaceChildren();
      for (const s of shown) this.drawSeries(s);
      this.drawLegend(shown);
      this.shown = shown;
      this.reset.hidden = this.zoom === null;
      Object.assign(this.root.dataset, {xMin: format(x0), xMax: format(x1), shown: String(shown.length)});
      this.hideHover();
    }

    drawAxes(x0, x1, y0, y1) {
      const axes = this.axes;
      axes.replaceChildren();
      const bottom = BOX.top + this.plotHeight();
      for (const t of linearTicks(x0, x1, 6)) {
        const x = this.px(t);
        svg("line", {class: "hs-grid", x1: x, x2: x, y1: BOX.top, y2: bottom}, axes);
        svg("text", {x: x, y: bottom + 16, "text-anchor": "middle", class: "hs-tick hs-xtick"}, axes)
          .textContent = format(t);
      }
      for (const t of this.log ? logTicks(y0, y1) : linearTicks(y0, y1, 5)) {
        const y = this.py(t);
        svg("line", {class: "hs-grid", x1: BOX.left, x2: BOX.left + this.plotWidth(), y1: y, y2: y}, axes);
        svg("text", {x: BOX.left - 6, y: y + 4, "text-anchor": "end", class: "hs-tick"}, axes)
          .textContent = format(t);
      }
      svg("rect", {class: "hs-frame", x: BOX.left, y: BOX.top, width: this.plotWidth(), height: this.plotHeight()},
          axes);
      svg("text", {x: BOX.left + this.plotWidth() / 2, y: BOX.height - 4, "text-anchor": "middle",
                   class: "hs-label"}, axes).textContent = this.spec.x_label || "";
      svg("text", {x: 12, y: BOX.top + this.plotHeight() / 2, "text-anchor": "middle", class: "hs-label",
                   transform: `rotate(-90 12 ${BOX.top + this.plotHeight() / 2})`}, axes)
        .textContent = (this.spec.y_label || "") + (this.log ? " (log)" : "");
    }

    drawSeries(s) {
      let path = "", pen = "M";
      const color = this.colorOf(s);
      for (let i = 0; i < s.xs.length; i++) {
        if (!this.usable(s.y[i])) { pen = "M"; continue; }
        const x = this.px(s.xs[i]).toFixed(1), y = this.py(s.y[i]).toFixed(1);
        path += `${pen}${x},${y}`;
        pen = "L";
        if (s.markers) svg("circle", {cx: x, cy: y, r: 3, fill: color, class: "hs-marker"}, this.lines);
      }
      const line = svg("path", {d: path, stroke: color, class: "hs-line"}, this.lines);
      if (s.dash) line.setAttribute("stroke-dasharray", "6 4");
      line.dataset.name = s.name;
    }

    drawLegend(shown) {
      this.legend.replaceChildren();
      if (shown.length > MAX_LEGEND) {
        html("span", "hs-more", this.legend, `${shown.length} series (hover a line for its name)`);
        return;
      }
      for (const s of shown) {
        const item = html("span", "hs-item", this.legend);
        const swatch = html("i", s.dash ? "hs-dash" : "", item);
        swatch.style.borderColor = this.colorOf(s);
        item.append(s.name);
      }
    }

    // Mouse position in the SVG's own coordinates (the SVG scales with the page).
    point(event) {
      const box = this.svg.getBoundingClientRect();
      return [(event.clientX - box.left) * BOX.width / box.width, (event.clientY - box.top) * BOX.height / box.height];
    }

    inPlot(x, y) {  // with a margin: a point on the frame stays easy to hover
      const m = 4;
      return x >= BOX.left - m && x <= BOX.left + this.plotWidth() + m && y >= BOX.top - m &&
             y <= BOX.top + this.plotHeight() + m;
    }

    nearest(mx, my) {
      let best = null;
      const x = this.fromPx(mx);
      for (const s of this.shown) {
        const at = lowerBound(s.xs, x);
        for (const i of [at - 1, at]) {
          if (i < 0 || i >= s.xs.length || !this.usable(s.y[i])) continue;
          const d = Math.hypot(this.px(s.xs[i]) - mx, this.py(s.y[i]) - my);
          if (!best || d < best.d) best = {d: d, s: s, i: i};
        }
      }
      return best;
    }

    hover(event) {
      const [mx, my] = this.point(event);
      const hit = this.inPlot(mx, my) ? this.nearest(mx, my) : null;
      if (!hit) { this.hideHover(); return; }
      const x = this.px(hit.s.xs[hit.i]), y = this.py(hit.s.y[hit.i]);
      Object.entries({x1: x, x2: x}).forEach(([k, v]) => this.guide.setAttribute(k, v));
      Object.entries({cx: x, cy: y, fill: this.colorOf(hit.s)}).forEach(([k, v]) => this.dot.setAttribute(k, v));
      this.guide.style.display = this.dot.style.display = "block";
      this.tip.replaceChildren();
      html("b", "", this.tip, hit.s.name);
      html("div", "", this.tip, `${this.spec.x_label || "x"} ${format(hit.s.xs[hit.i])}: ${format(hit.s.y[hit.i])}`);
      const box = this.svg.getBoundingClientRect(), root = this.root.getBoundingClientRect();
      const left = box.left - root.left + x * box.width / BOX.width;
      this.tip.style.left = `${Math.min(left + 12, root.width - 220)}px`;
      this.tip.style.top = `${box.top - root.top + y * box.height / BOX.height + 12}px`;
      this.tip.style.display = "block";
    }

    hideHover() {
      this.guide.style.display = this.dot.style.display = this.tip.style.display = "none";
    }

    setZoom(range) {
      this.zoom = range;
      this.render();
    }

    listen() {
      let start = null;
      this.svg.addEventListener("mousedown", event => {
        const [x, y] = this.point(event);
        if (!this.inPlot(x, y)) return;
        start = Math.max(BOX.left, Math.min(BOX.left + this.plotWidth(), x));
        event.preventDefault();
      });
      this.svg.addEventListener("mousemove", event => {
        if (start === null) { this.hover(event); return; }
        const x = Math.max(BOX.left, Math.min(BOX.left + this.plotWidth(), this.point(event)[0]));
        this.brush.setAttribute("x", Math.min(start, x));
        this.brush.setAttribute("width", Math.abs(x - start));
        this.brush.style.display = "block";
        this.hideHover();
      });
      window.addEventListener("mouseup", event => {
        if (start === null) return;
        const end = Math.max(BOX.left, Math.min(BOX.left + this.plotWidth(), this.point(event)[0]));
        const from = start;
        start = null;
        this.brush.style.display = "none";
        if (Math.abs(end - from) > 4) this.setZoom([this.fromPx(Math.min(from, end)), this.fromPx(Math.max(from, end))]);
      });
      this.svg.addEventListener("mouseleave", () => this.hideHover());
      this.svg.addEventListener("dblclick", () => this.setZoom(null));
    }
  }

  function buildFilter(root) {
    const spec = readSpec(root);
    const group = {layers: spec.layers, shown: new Set(spec.shown), preset: new Set(spec.shown), charts: []};
    groups[spec.group] = group;
    const bar = html("div", "hs-bar", root);
    const count = html("span", "hs-count", bar);
    const find = html("input", "hs-find", bar);
    Object.assign(find, {type: "search", placeholder: "find a layer"});
    const list = html("div", "hs-layers", root);
    const boxes = spec.layers.map(layer => {
      const label = html("label", "", list);
      const box = html("input", "", label);
      Object.assign(box, {type: "checkbox", value: layer, checked: group.shown.has(layer)});
      label.append(" " + layer);
      box.addEventListener("change", () => {
        if (box.checked) group.shown.add(layer); else group.shown.delete(layer);
        update();
      });
      return box;
    });
    const update = () => {
      boxes.forEach(box => { box.checked = group.shown.has(box.value); });
      count.textContent = `${group.shown.size} of ${spec.layers.length} layers shown`;
      group.charts.forEach(chart => chart.render());
    };
    const choose = (name, layers) => {
      const button = html("button", "", bar, name);
      button.type = "button";
      button.addEventListener("click", () => { group.shown = new Set(layers()); update(); });
    };
    const matching = () => spec.layers.filter(l => l.includes(find.value));
    choose("all", () => [...group.shown, ...matching()]);
    choose("none", () => [...group.shown].filter(l => !l.includes(find.value)));
    choose("first picks", () => group.preset);
    find.addEventListener("input", () => {
      boxes.forEach(box => { box.parentElement.hidden = !box.value.includes(find.value); });
    });
    group.update = update;
    count.textContent = `${group.shown.size} of ${spec.layers.length} layers shown`;
  }

  function init() {
    document.querySelectorAll(".hs-filter").forEach(buildFilter);
    document.querySelectorAll(".hs-chart").forEach(root => {
      const chart = new Chart(root, readSpec(root));
      const group = groups[chart.spec.group];
      if (group) group.charts.push(chart);
      chart.render();
    });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
