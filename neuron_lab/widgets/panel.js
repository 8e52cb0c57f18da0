// neuron_lab's live views. The kernel sends `data` (after each cell) and `live` (while a cell runs);
// everything the user clicks (tab, sort, filter, expanded rows) stays here, because messages to a
// busy kernel wait until its cell ends. Text goes in with textContent only: no HTML from data.
// The data is the report model's own (snapshot.py); the header names the views and the op kinds
// (neuron_lab.kinds), so nothing here spells a kind, its title or its order.

const uiState = new Map(); // uid -> UI state, so a re-rendered view keeps it

function fmtBytes(n) {
  const a = Math.abs(n);
  for (const [u, s] of [["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]]) {
    if (a >= s) return (n / s).toFixed(2) + " " + u;
  }
  return n + " B";
}
const fmtDelta = (n) => (n >= 0 ? "+" : "-") + fmtBytes(Math.abs(n));
function fmtSec(s) {
  if (s >= 1) return s.toFixed(2) + " s";
  if (s >= 1e-3) return (s * 1e3).toFixed(1) + " ms";
  return (s * 1e6).toFixed(0) + " µs";
}
const fmtInt = (n) => (n || 0).toLocaleString("en-US");
const plural = (n, noun) => noun + (n === 1 ? "" : "s");

function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") el.className = v;
    else if (k === "onclick") el.addEventListener("click", v);
    else if (k === "onpointerdown") el.addEventListener("pointerdown", v);
    else if (k === "ontoggle") el.addEventListener("toggle", v);
    else el.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function table(headers, rows, attrs = {}) {
  return h("table", { class: "nl-table", ...attrs },
    h("thead", {}, h("tr", {}, headers.map((x) => (x instanceof Node ? x : h("th", {}, x))))),
    h("tbody", {}, rows));
}

// a report model Site: a notebook cell's line, or a file's (Site.label)
const siteLabel = (s) => (!s ? "?" : s.cell !== null && s.cell !== undefined ? `In[${s.cell}] line ${s.line}`
  : `${s.filename}:${s.line}`);
const cellLabel = (n) => `In[${n ?? "?"}]`;

// -- the op kinds, from the header (neuron_lab.kinds.as_json(), in display order) -------------------
const kindsOf = (data) => (data.header && data.header.kinds) || [];
function kindTitle(data, name) {
  const k = kindsOf(data).find((x) => x.name === name);
  return k ? k.title : name;
}
// what live.fallback_calls counts: calls of the kinds that did not run on the device ("CPU fallback call")
function offDeviceCall(data, n) {
  const k = kindsOf(data).find((x) => x.off_device);
  return plural(n, k ? k.call : "off-device call");
}
// rows in the reports' sections (neuron_lab.kinds.sections: [kind that titles it, member kinds]), the empty left out
function sections(data, rows) {
  return ((data.header && data.header.sections) || [])
    .map(([kind, members]) => [kind, rows.filter((r) => members.includes(r.kind))])
    .filter(([, mine]) => mine.length);
}

// -- memory ---------------------------------------------------------------------------------------
function memoryBar(live, testid) {
  const cap = live.capacity || 0;
  const pct = cap ? Math.min(100, (100 * (live.allocated || 0)) / cap) : 0;
  const peak = cap ? Math.min(100, (100 * (live.peak || 0)) / cap) : 0;
  return h("div", { class: "nl-bar", title: `${pct.toFixed(1)}% of capacity` },
    h("div", { class: "nl-bar-fill", style: `width:${pct}%`, "data-testid": testid }),
    h("div", { class: "nl-bar-peak", style: `left:${peak}%` }));
}

// The memory timeline, drawn by uPlot (vendor/, put before this file by panel.py). x: seconds since the session
// started, or cells (each the same width, so a long compile does not squash the rest); y: allocated bytes in
// one unit (B/KiB/MiB/GiB). Cell bands carry DOM labels, left out where they would not fit or would overlap;
// OOM marks and the session's peak are markers. Drag to zoom in, wheel to zoom around the cursor, double-click
// or "reset zoom" to see it all; the zoom and the axis choice stay across updates (ui state).
const UNITS = [["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10], ["B", 1]];
const unitFor = (top) => UNITS.find(([, s]) => top >= s) || UNITS[UNITS.length - 1];
const LABEL_PX = 7; // an estimate of a label character's width, for the overlap test

// time -> x in the by-cell axis: cell i spans [i, i+1]; time between cells collapses onto a boundary
function byCell(spans) {
  return (t) => {
    let i = 0;
    for (const { start_s: s, end_s: e } of spans) {
      if (t < s) return i;
      if (t <= e) return i + (e > s ? (t - s) / (e - s) : 1);
      i += 1;
    }
    return i;
  };
}

// the cell edges in view, thinned to one per 60 px
function edges(u, n) {
  const { min, max } = u.scales.x, out = [];
  let last = -Infinity;
  for (let i = Math.max(Math.ceil(min), 0); i <= Math.min(Math.floor(max), n); i++) {
    const x = u.valToPos(i, "x");
    if (x - last >= 60) { out.push(i); last = x; }
  }
  return out;
}

// the labels that fit: each inside its band, none over the one before it
function placeLabels(bands) {
  const shown = [];
  let right = -Infinity;
  for (const b of bands) {
    const w = b.text.length * LABEL_PX + 4;
    if (b.x1 - b.x0 < w || b.x0 < right) continue;
    shown.push(b);
    right = b.x0 + w;
  }
  return shown;
}

function timeline(ctx, m, live) {
  const { ui } = ctx;
  const mode = ui.xmode || "time";
  const spans = m.cells.slice().sort((a, b) => a.start_s - b.start_s);
  if (live.busy && live.t !== undefined) spans.push({ cell: live.cell ?? "?", start_s: live.t - (live.elapsed_s || 0), end_s: live.t, running: true });
  const pts = m.points.concat(ctx.running).sort((a, b) => a[0] - b[0]);
  const wrap = h("div", { class: "nl-chart", "data-testid": "nl-timeline", "data-xmode": mode });
  const pick = (v, label) => h("button", {
    class: "nl-button" + (mode === v ? " nl-active" : ""), "data-xmode": v,
    onclick: () => { ui.xmode = v; ui.zoom = null; ctx.rerender(); },
  }, label);
  const bar = h("div", { class: "nl-chart-bar" }, h("span", { class: "nl-muted" }, "x axis: "),
    pick("time", "by time"), pick("cell", "by cell"),
    h("button", { class: "nl-button", "data-testid": "nl-zoom-reset", onclick: () => { ui.zoom = null; ctx.rerender(); } }, "reset zoom"),
    h("span", { class: "nl-muted" }, " drag or wheel to zoom"));
  if (!pts.length) return h("div", {}, bar, h("div", { class: "nl-muted" }, "no memory samples yet"));
  const X = mode === "cell" ? byCell(spans) : (t) => t;
  const peakRow = m.rows.reduce((a, r) => (a && a.memory.peak >= r.memory.peak ? a : r), null);
  const peak = Math.max(live.peak || 0, peakRow ? peakRow.memory.peak : 0, ...pts.map((p) => p[1]));
  const [unit, scale] = unitFor(Math.max(peak, 1));
  const xs = pts.map((p) => X(p[0])), ys = pts.map((p) => p[1] / scale);
  const width = Math.max(ctx.width - 60, 240), height = 170;
  const title = (text, cls, testid) => h("div", { class: cls, "data-testid": testid }, text);
  const yTitle = title(`allocated (${unit})`, "nl-axis-title nl-axis-y", "nl-axis-y");
  const xTitle = title(mode === "cell" ? "cells, each the same width (ticks: seconds since the session started)"
    : "seconds since the session started", "nl-axis-title nl-axis-x", "nl-axis-x");
  const tOf = (x) => { // x -> seconds, for the by-cell ticks
    if (mode !== "cell") return x;
    const i = Math.min(Math.floor(x), spans.length - 1), s = spans[Math.max(i, 0)];
    return s ? s.start_s + (s.end_s - s.start_s) * Math.min(Math.max(x - i, 0), 1) : 0;
  };
  // by time, up to the last sample, cell end or mark (a mark can come after the last sample: an OOM ends its cell)
  const xMax = mode === "cell" ? Math.max(spans.length, 1)
    : Math.max(xs[xs.length - 1], xs[0] + 1e-3, ...spans.map((b) => b.end_s), ...(m.marks || []).map((mk) => mk.t_s));
  const overlay = h("div", { class: "nl-chart-overlay" });
  const drawMarks = (u) => {
    const c = u.ctx, top = u.bbox.top, hgt = u.bbox.height;
    c.save();
    spans.forEach((b, i) => {
      const x0 = u.valToPos(mode === "cell" ? i : b.start_s, "x", true), x1 = u.valToPos(mode === "cell" ? i + 1 : b.end_s, "x", true);
      c.fillStyle = i % 2 ? "rgba(52,152,219,0.08)" : "rgba(52,152,219,0.16)";
      c.fillRect(x0, top, Math.max(x1 - x0, 1), hgt);
    });
    for (const mk of m.marks || []) {
      const x = u.valToPos(X(mk.t_s), "x", true);
      c.strokeStyle = "#c0392b"; c.lineWidth = 2 * devicePixelRatio;
      c.beginPath(); c.moveTo(x, top); c.lineTo(x, top + hgt); c.stroke();
    }
    const py = u.valToPos(peak / scale, "y", true);
    c.strokeStyle = "#c0392b"; c.lineWidth = devicePixelRatio; c.setLineDash([4 * devicePixelRatio, 3 * devicePixelRatio]);
    c.beginPath(); c.moveTo(u.bbox.left, py); c.lineTo(u.bbox.left + u.bbox.width, py); c.stroke();
    c.restore();
  };
  const drawLabels = (u) => { // DOM labels over the plot area: bands, marks, the peak
    const kids = [], w = u.bbox.width / devicePixelRatio;
    const bands = spans.map((b, i) => ({ // the part of each band in view
      text: cellLabel(b.cell), x0: Math.max(u.valToPos(mode === "cell" ? i : b.start_s, "x"), 0),
      x1: Math.min(u.valToPos(mode === "cell" ? i + 1 : b.end_s, "x"), w) })).filter((b) => b.x1 > b.x0);
    for (const b of placeLabels(bands)) {
      kids.push(h("div", { class: "nl-band-label", "data-testid": "nl-band-label", style: `left:${b.x0 + 2}px` }, b.text));
    }
    for (const mk of m.marks || []) { // the label on the side with room
      const px = u.valToPos(X(mk.t_s), "x");
      kids.push(h("div", { class: "nl-mark nl-mark-" + mk.kind, "data-testid": "nl-mark-" + mk.kind, title: mk.label,
        style: px > w - 40 ? `right:${w - px + 3}px` : `left:${px + 3}px` }, mk.kind === "oom" ? "OOM" : mk.kind));
    }
    kids.push(h("div", { class: "nl-mark nl-mark-peak", "data-testid": "nl-mark-peak",
      style: `top:${u.valToPos(peak / scale, "y") + 2}px; right:4px` },
      `peak ${fmtBytes(peak)}` + (peakRow && peakRow.memory.peak >= peak ? ` (${cellLabel(peakRow.cell)})` : "")));
    overlay.replaceChildren(...kids);
  };
  const axisFont = "11px sans-serif";
  const opts = {
    width, height, legend: { show: false },
    cursor: { drag: { x: true, y: false }, points: { show: false } },
    scales: { x: { time: false, range: () => (ui.zoom ? ui.zoom : [mode === "cell" ? 0 : xs[0], xMax]) },
      y: { range: (u, lo, hi) => [0, Math.max(peak / scale, hi) * 1.2 || 1] } }, // room above the peak for the labels
    axes: [
      { font: axisFont, size: 30, space: 60, values: (u, vals) => vals.map((v) => fmtSec(Math.max(tOf(v), 0))),
        // by cell, the ticks are the cells' edges (each labelled with the time it began), at least 60 px apart
        ...(mode === "cell" ? { splits: (u) => edges(u, spans.length) } : {}) },
      { font: axisFont, size: 56, values: (u, vals) => vals.map((v) => +v.toFixed(2) + " " + unit) },
    ],
    series: [{}, { stroke: "#e67e22", width: 1.5, fill: "rgba(230,126,34,0.12)", points: { show: false } }],
    hooks: {
      drawClear: [drawMarks], draw: [drawLabels],
      setSelect: [(u) => {
        if (u.select.width < 3) return;
        ui.zoom = [u.posToVal(u.select.left, "x"), u.posToVal(u.select.left + u.select.width, "x")];
        u.setSelect({ left: 0, width: 0 }, false);
        u.setScale("x", { min: ui.zoom[0], max: ui.zoom[1] });
      }],
      ready: [(u) => {
        u.over.append(overlay);
        u.over.addEventListener("dblclick", () => { ui.zoom = null; ctx.rerender(); });
        u.over.addEventListener("wheel", (e) => {
          e.preventDefault();
          const { min, max } = u.scales.x, at = u.posToVal(e.offsetX, "x"), f = e.deltaY > 0 ? 1.25 : 0.8;
          ui.zoom = [at - (at - min) * f, at + (max - at) * f];
          u.setScale("x", { min: ui.zoom[0], max: ui.zoom[1] });
        }, { passive: false });
      }],
    },
  };
  opts.cursor.drag.setScale = false;
  ctx.charts.push(new uPlot(opts, [xs, ys], wrap)); // eslint-disable-line no-undef
  return h("div", {}, bar, h("div", { class: "nl-chart-row" }, yTitle, h("div", { class: "nl-chart-main" }, wrap, xTitle)));
}

// the ranks of `%neuron ranks` (live.ranks: each rank's own counters, a table per host; words from the kernel)
function ranksBlock(data, live) {
  if (!live.ranks) return null;
  const known = (r, n) => ("allocated" in r ? fmtBytes(n || 0) : "?");
  return h("div", { class: "nl-ranks", "data-testid": "nl-ranks" }, h("b", {}, live.ranks.head),
    live.ranks.hosts.map((g) => h("div", { "data-host": g.host }, h("div", { class: "nl-muted" }, g.head),
      table((data.header && data.header.rank_columns) || [], g.rows.map((r) => h("tr", { "data-rank": r.rank },
        h("td", {}, String(r.rank)), h("td", {}, r.device),
        h("td", { "data-testid": "nl-rank-allocated" }, known(r, r.allocated)), h("td", {}, known(r, r.peak)),
        h("td", {}, r.capacity_text || "?"), h("td", {}, fmtInt(r.fallback_calls)),
        h("td", { "data-testid": "nl-rank-status" }, r.status_text)))))));
}

function memoryView(ctx) {
  const { data, live, model, ui, connected } = ctx;
  const m = data.memory || { points: [], cells: [], rows: [] };
  const busy = !!live.busy;
  const button = h("button", {
    class: "nl-button", "data-testid": "nl-free", ...(connected ? {} : { disabled: "" }),
    title: "drops IPython's references to device tensors (Out, _, the last traceback), like %neuron free",
    onclick: () => { ui.freeQueued = true; model.send({ action: "free" }); ctx.rerender(); },
  }, ui.freeQueued && busy ? "Free: queued, runs when the cell finishes" : "Free IPython's references");
  const note = busy ? h("span", { class: "nl-muted" }, " a cell is running: the kernel handles clicks between cells") : null;
  const rows = m.rows.slice().reverse().map(({ cell, wall_s, memory: r }) => {
    const delta = r.after - r.before;
    return h("tr", {},
      h("td", {}, `In[${cell}]`), h("td", {}, fmtBytes(r.before)), h("td", {}, fmtBytes(r.after)),
      h("td", { class: delta > 0 ? "nl-up" : delta < 0 ? "nl-down" : "" }, fmtDelta(delta)),
      h("td", {}, fmtBytes(r.peak)), h("td", {}, fmtSec(wall_s)));
  });
  return h("div", { class: "nl-memory" },
    h("div", { class: "nl-numbers" },
      h("span", {}, "allocated ", h("b", { "data-testid": "nl-mem-allocated" }, fmtBytes(live.allocated || 0))),
      h("span", {}, "peak ", h("b", { "data-testid": "nl-mem-peak" }, fmtBytes(live.peak || 0))),
      h("span", {}, "capacity ", h("b", {}, live.capacity_text || fmtBytes(live.capacity || 0)))),
    memoryBar(live, "nl-mem-bar"),
    ranksBlock(data, live),
    timeline(ctx, m, live),
    m.sampling ? h("div", { class: "nl-muted" }, m.sampling) : null,
    h("div", { class: "nl-actions" }, button, note, m.freed ? h("pre", { class: "nl-pre" }, m.freed) : null),
    rows.length ? h("div", { class: "nl-scroll" }, table(["cell", "before", "after", "delta", "peak", "wall"], rows))
      : h("div", { class: "nl-muted" }, "no cell has used the device yet"));
}

// when the data was taken: the tensors are listed between cells only (a scan of every object, not a counter read)
function asOf({ data, live, follow }) {
  const at = data.as_of || {};
  if (!follow) return `as of the end of ${cellLabel(at.cell)}`;
  if (live.busy && live.t !== undefined && at.t !== undefined) {
    return `as of ${cellLabel(at.cell)}, ${fmtSec(Math.max(live.t - at.t, 0))} ago: refreshed when ${cellLabel(live.cell)} ends`;
  }
  return `as of ${cellLabel(at.cell)}: refreshed after each cell`;
}

// -- tensors --------------------------------------------------------------------------------------
function tensorsView(ctx) {
  const { data, ui } = ctx;
  const t = data.tensors;
  if (!t) return h("div", {}, "…");
  const key = ui.sortKey || "bytes", desc = ui.sortDesc !== false;
  const val = (r) => (key === "names" ? (r.names[0] || "") : key === "shape" ? (r.shape || []).reduce((a, b) => a * b, 1)
    : r[key] ?? "");
  const rows = t.rows.slice().sort((a, b) => {
    const va = val(a), vb = val(b);
    return (va < vb ? -1 : va > vb ? 1 : 0) * (desc ? -1 : 1);
  });
  const th = (k, label) => h("th", {
    class: "nl-sortable", "data-sort": k,
    onclick: () => { ui.sortDesc = ui.sortKey === k ? !desc : true; ui.sortKey = k; ctx.rerender(); },
  }, label + (key === k ? (desc ? " ▼" : " ▲") : ""));
  const body = rows.map((r) => h("tr", { "data-testid": "nl-tensor-row" },
    h("td", {}, r.names.length ? r.names.join(", ") : "—"),
    h("td", {}, r.shape_text), h("td", {}, r.dtype || "?"),
    h("td", { class: "nl-num" }, fmtBytes(r.bytes)), h("td", {}, r.requires_grad ? "✓" : ""), h("td", {}, r.held_by)));
  return h("div", {},
    h("div", { class: "nl-numbers" },
      h("span", {}, `${t.rows.length} storages · total `, h("b", { "data-testid": "nl-tensors-total" }, fmtBytes(t.total))),
      h("span", { class: "nl-muted" }, `memory_allocated ${fmtBytes(t.allocated)}`)),
    h("div", { class: "nl-scroll" }, table(
      [th("names", "names"), th("shape", "shape"), th("dtype", "dtype"), th("bytes", "bytes"),
        th("requires_grad", "grad"), th("held_by", "held by")], body)),
    h("div", { class: "nl-muted", "data-testid": "nl-tensors-as-of" }, asOf(ctx) + "; the view holds no tensor"));
}

// -- fallbacks ------------------------------------------------------------------------------------
// a reason is a sentence, then where the fact comes from, after the model's marker (report.model.SOURCE)
function splitReason(ctx, reason) {
  const marker = ctx.data.header && ctx.data.header.reason_source;
  return marker && reason.includes(marker) ? reason.split(marker, 2) : [reason, ""];
}

// rows grouped by their reason, in the order the reasons first come: many ops share one reason, said once
function byReason(ctx, rows) {
  const groups = new Map();
  for (const r of rows) {
    if (!groups.has(r.reason)) groups.set(r.reason, []);
    groups.get(r.reason).push(r);
  }
  return [...groups].map(([reason, mine]) => {
    const [why, source] = splitReason(ctx, reason);
    return h("div", { class: "nl-reason-group", "data-testid": "nl-reason-group" },
      h("div", { class: "nl-reason", "data-testid": "nl-reason" }, why,
        source ? h("span", { class: "nl-muted", "data-testid": "nl-reason-source" }, ` (source: ${source})`) : null),
      mine.map((r) => opRow(r, ctx.ui)));
  });
}

function opRow(r, ui) {
  const key = r.kind + ":" + r.op + ":" + (r.ranks || 0);  // a collective has a row per group size
  const sites = r.sites.map(({ site: s, count }) => h("tr", { "data-testid": "nl-site" },
    h("td", {}, s.cell !== null && s.cell !== undefined ? cellLabel(s.cell) : siteLabel(s)),
    h("td", {}, `line ${s.line}`), h("td", {}, h("code", {}, s.source)),
    h("td", { class: "nl-num" }, fmtInt(count) + "×")));
  if (r.unattributed) sites.push(h("tr", {}, h("td", { colspan: 4, class: "nl-muted" },
    `${fmtInt(r.unattributed)} calls without a user line`)));
  const shapes = r.shapes.map((s) => "(" + s.join(", ") + ")").join(" ");
  const d = h("details", {
    class: "nl-op", "data-testid": "nl-fallback-row", "data-op": r.op,
    ontoggle: (e) => { if (e.target.open) ui.open.add(key); else ui.open.delete(key); },
  },
    h("summary", {}, h("code", {}, r.op), h("span", { class: "nl-num" }, ` ${fmtInt(r.count)}×`),
      h("span", {}, ` ${fmtSec(r.host_ns / 1e9)}`),
      h("span", { class: "nl-muted" }, ` · first ${shapes} ${r.dtypes.join(" ")}`)),
    table(["cell", "line", "source", "calls"], sites));
  if (ui.open.has(key)) d.open = true;
  return d;
}

function fallbacksView(ctx) {
  const { data, live, ui } = ctx;
  const f = data.fallbacks;
  const hd = data.header || {};
  if (!f) return h("div", {}, "…");
  const scope = ui.scope || "cell";
  // while a cell runs, "this cell" is the running one, with its rows so far (live.rows)
  const running = live.busy && live.rows;
  const cell = running ? live.cell : f.last;
  const rows = scope === "all" ? f.all : running ? live.rows : f.cell;
  const pick = (s, label) => h("label", {}, h("input", Object.assign({ type: "radio", name: "scope-" + ctx.uid, value: s },
    scope === s ? { checked: "" } : {})), label);
  const radios = [pick("cell", `this cell (${cellLabel(cell)}${running ? ", running" : ""})`), pick("all", "all cells")];
  for (const r of radios) r.querySelector("input").addEventListener("change", (e) => { ui.scope = e.target.value; ctx.rerender(); });
  const shown = sections(data, rows).map(([kind, mine]) => h("div", { class: "nl-section", "data-kind": kind },
    h("div", { class: "nl-subtitle" },
      `${kindTitle(data, kind)}: ${mine.length} ops, ${fmtInt(mine.reduce((a, r) => a + r.count, 0))} calls`),
    byReason(ctx, mine)));
  const title = (hd.titles || {}).fallbacks || "";
  return h("div", {},
    h("div", { class: "nl-numbers" },
      h("span", {}, "coverage ", h("b", { "data-testid": "nl-coverage" }, hd.coverage || "none")),
      h("span", { class: "nl-muted" }, hd.coverage_hint || "")),
    live.busy ? h("div", { class: "nl-running" }, `${cellLabel(live.cell)} running: `,
      h("b", { "data-testid": "nl-live-fallbacks" }, fmtInt(live.fallback_calls)),
      ` ${offDeviceCall(data, live.fallback_calls)} so far`) : null,
    h("div", { class: "nl-filter" }, radios),
    shown.length ? shown : h("div", { class: "nl-muted", "data-testid": "nl-no-fallbacks" },
      scope === "all" ? `no ${title} in this session` : `no ${title} in ${cellLabel(cell)}${running ? " so far" : ""}`),
    scope === "all" && running ? h("div", { class: "nl-muted" }, `all cells: up to the last finished one; ${cellLabel(cell)} joins when it ends`) : null,
    f.callsites ? null : h("div", { class: "nl-muted" }, "call sites are off (%config NeuronLab.callsites = True)"));
}

// a compile in progress (live.compiling), in the progress line's words (its text): "compiling MyLM: lowering graph 1
// to the neuron device — 3 s"
const compiling = (live) => (live.busy && live.compiling
  ? h("span", { class: "nl-running", "data-testid": "nl-compiling" }, live.compiling.text)
  : null);

// -- compiles -------------------------------------------------------------------------------------
function compilesView(ctx) {
  const c = ctx.data.compiles;
  if (!c) return h("div", {}, "…");
  const rows = c.rows.slice().reverse().map((r) => {
    const details = [];
    const k = r.compiles;
    for (const b of k.breaks) details.push(h("div", { class: "nl-break" }, "graph break at ", h("code", {}, siteLabel(b.site)),
      b.site ? h("code", { class: "nl-muted" }, " " + b.site.source) : null, ": " + b.reason,
      b.hint ? h("div", { class: "nl-muted" }, "fix: " + b.hint) : null));
    for (const x of k.recompiles) details.push(h("div", { class: "nl-recompile" }, `recompile of ${x.code}`,
      x.site ? h("code", {}, " " + siteLabel(x.site)) : null, ": " + x.reason));
    for (const x of k.failures) details.push(h("div", { class: "nl-up" }, "failed: " + x));
    for (const x of r.checks) details.push(h("div", { class: "nl-check", "data-testid": "nl-check",
      title: "the full result is in the cell's report" }, x));
    const total = k.compile_s + r.run_s || 1;
    return h("tr", {}, h("td", {}, `In[${r.cell}]`), h("td", {}, r.mode), h("td", { class: "nl-num" }, k.graphs),
      h("td", { class: "nl-num" }, k.breaks.length), h("td", { class: "nl-num" }, k.recompiles.length),
      h("td", {}, fmtSec(k.compile_s)), h("td", {}, fmtSec(r.run_s)),
      h("td", {}, h("div", { class: "nl-bar nl-bar-small", title: "compile time against run time" },
        h("div", { class: "nl-bar-fill nl-compile", style: `width:${(100 * k.compile_s) / total}%` }))),
      h("td", {}, details));
  });
  const t = c.totals;
  return h("div", {},
    h("div", { class: "nl-numbers" }, h("span", {}, `${t.compiles} frames compiled · ${t.graph_breaks} graph breaks · ${t.recompiles} recompiles`)),
    compiling(ctx.live),
    rows.length ? h("div", { class: "nl-scroll" }, table(
      ["cell", "mode", "graphs", "breaks", "recompiles", "compile", "run", "compile/run", "details"], rows))
      : h("div", { class: "nl-muted" }, "nothing compiled yet: `%%neuron compile` compiles a cell's module calls"));
}

// -- the strip under a running cell ---------------------------------------------------------------------
function stripView(ctx) {
  const { data, live } = ctx;
  return h("div", { class: "nl-strip" },
    h("span", {}, `${live.device || ""} · ${live.mode || ""}`), memoryBar(live, "nl-strip-bar"),
    h("span", {}, fmtBytes(live.allocated || 0) + " / " + (live.capacity_text || fmtBytes(live.capacity || 0))),
    h("span", {}, h("b", {}, fmtInt(live.fallback_calls)), " " + offDeviceCall(data, live.fallback_calls)),
    live.syncs_text ? h("span", { "data-testid": "nl-live-syncs" }, live.syncs_text) : null,
    h("span", { class: "nl-muted" }, live.busy ? `running ${fmtSec(live.elapsed_s || 0)}` : `done in ${fmtSec(live.elapsed_s || 0)}`),
    compiling(live));
}

// -- whether the kernel behind the view is still there ------------------------------------------------------
// "live"; "gone": the notebook has no kernel (shut down, dead); "restarted": the widget manager marks the model's
// comm dead (comm_live) when the kernel restarts, and a model drawn from a saved notebook's state has none;
// "export": no comm and a manager with no kernel at all (an HTML export's). Only "live" moves.
function connection(model, backing) {
  const wm = model.widget_manager;
  const kernelled = !!wm && "kernel" in wm;
  if (kernelled && (!wm.kernel || wm.kernel.isDisposed || wm.kernel.status === "dead")) return "gone";
  if (!backing || backing.comm_live) return "live";
  return kernelled ? "restarted" : "export";
}

// The widget model behind anywidget's proxy, which does not pass comm_live on: the manager's model with our uid.
async function backingModel(model, uid) {
  for (const promise of Object.values((model.widget_manager || {})._models || {})) {
    const m = await promise;
    if (m.get("uid") === uid) return m;
  }
  return null;
}

// what a view that cannot move says instead of a live status
function notLive(state, views, data) {
  const again = `run %neuron ${views.length > 1 ? "dashboard" : views[0]} again`;
  const stamp = (data.as_of || {}).stamp; // snapshot.as_of words it
  if (state === "export") return stamp;
  const why = state === "gone" ? "the kernel is gone" : "kernel restarted";
  return `disconnected — ${why}; ${again}. Below: the ${stamp}`;
}

const RENDER = { memory: memoryView, tensors: tensorsView, fallbacks: fallbacksView, compiles: compilesView, strip: stripView };

function render({ model, el }) {
  const uid = model.get("uid");
  if (!uiState.has(uid)) uiState.set(uid, { tab: null, open: new Set() });
  const ui = uiState.get(uid);
  const root = h("div", { class: "neuron-lab", "data-testid": "nl-panel" });
  el.append(root);
  let running = []; // live samples of the running cell, drawn after the session's points
  let lastBusy = false;

  let charts = []; // the uPlot instances drawn last, destroyed before the next draw
  let backing = null; // found after the first draw (backingModel)
  let state = connection(model, backing);

  function rerender() {
    const views = model.get("views");
    const data = model.get("data") || {};
    const follow = model.get("follow") !== false;
    const moving = follow && state === "live";
    const live = moving ? model.get("live") || {} : { ...(model.get("live") || {}), busy: false };
    if (!ui.tab || !views.includes(ui.tab)) ui.tab = views[0];
    for (const c of charts) c.destroy();
    charts = [];
    const ctx = { model, data, live, ui, uid, running, rerender, charts, follow, connected: state === "live",
      width: root.clientWidth || 640 };
    const kids = [];
    root.classList.toggle("nl-disconnected", state !== "live");
    if (state !== "live") {
      kids.push(h("div", { class: "nl-stale-note", "data-testid": "nl-disconnected", "data-state": state },
        notLive(state, views, data)));
    }
    if (!follow) {
      kids.push(h("div", { class: "nl-muted nl-scope", "data-testid": "nl-scope" },
        `as of the end of ${cellLabel((data.as_of || {}).cell)}: this view keeps its cell's state `
        + "(`--live` follows the session)"));
    }
    if (views.length > 1) {
      // A tab switches on press: live updates replace the panel's DOM several times a second, so a press and its
      // release may land on two different buttons and no click would fire. The click stays for the keyboard.
      const select = (v) => () => { if (ui.tab !== v) { ui.tab = v; rerender(); } };
      kids.push(h("div", { class: "nl-tabs" }, views.map((v) => h("button", {
        class: "nl-tab" + (v === ui.tab ? " nl-active" : ""), "data-view": v,
        onpointerdown: select(v), onclick: select(v),
      }, ((data.header && data.header.titles) || {})[v] || v)),
      h("span", { class: "nl-status", "data-testid": "nl-status" },
        state !== "live" ? (state === "export" ? "snapshot" : "disconnected")
          : live.busy ? `${cellLabel(live.cell)} running · ${fmtBytes(live.allocated || 0)} · `
            + `${fmtInt(live.fallback_calls)} ${offDeviceCall(data, live.fallback_calls)}`
            : `idle · ${fmtBytes(live.allocated || 0)}`)));
    }
    kids.push(h("div", { class: "nl-body", "data-view": ui.tab }, (RENDER[ui.tab] || (() => "?"))(ctx)));
    root.replaceChildren(...kids);
  }

  const onData = () => { running = []; rerender(); };
  const onLive = () => {
    const live = model.get("live") || {};
    if (live.busy && live.t !== undefined) running.push([live.t, live.allocated]);
    if (lastBusy && !live.busy) ui.freeQueued = false;
    lastBusy = !!live.busy;
    rerender();
  };
  model.on("change:data", onData);
  model.on("change:live", onLive);
  model.on("change:views", rerender);
  // a restart marks the comm dead (comm_live_update); a kernel shut down says nothing to the model: look each second
  const recheck = () => {
    const now = connection(model, backing);
    if (now !== state) { state = now; rerender(); }
  };
  model.on("comm_live_update", recheck);
  const poll = setInterval(recheck, 1000);
  rerender();
  backingModel(model, uid).then((m) => { backing = m; recheck(); }, () => {});
  return () => {
    clearInterval(poll);
    model.off("comm_live_update", recheck);
    model.off("change:data", onData);
    model.off("change:live", onLive);
    model.off("change:views", rerender);
    for (const c of charts) c.destroy();
  };
}

export default { render };
