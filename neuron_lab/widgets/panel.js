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

function sparkline(points, cells, running) {
  const W = 600, H = 70;
  const all = points.concat(running);
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("class", "nl-spark");
  svg.setAttribute("preserveAspectRatio", "none");
  svg.setAttribute("data-testid", "nl-timeline");
  if (!all.length) return svg;
  const t0 = all[0][0], t1 = Math.max(all[all.length - 1][0], t0 + 1e-6);
  const top = Math.max(...all.map((p) => p[1]), 1);
  const x = (t) => ((t - t0) / (t1 - t0)) * W;
  const y = (b) => H - 2 - (b / top) * (H - 12);
  for (const { cell, start_s: s, end_s: e } of cells) {
    if (e < t0) continue;
    const r = document.createElementNS(ns, "rect");
    r.setAttribute("x", x(s)); r.setAttribute("width", Math.max(x(e) - x(s), 1));
    r.setAttribute("y", 0); r.setAttribute("height", H); r.setAttribute("class", "nl-spark-cell");
    const title = document.createElementNS(ns, "title");
    title.textContent = `In[${cell}]`;
    r.append(title);
    svg.append(r);
    const l = document.createElementNS(ns, "text");
    l.setAttribute("x", x(s) + 2); l.setAttribute("y", 9); l.setAttribute("class", "nl-spark-label");
    l.textContent = cell;
    svg.append(l);
  }
  const path = document.createElementNS(ns, "path");
  path.setAttribute("d", all.map((p, i) => `${i ? "L" : "M"}${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" "));
  path.setAttribute("class", "nl-spark-line");
  svg.append(path);
  return svg;
}

function memoryView(ctx) {
  const { data, live, model, ui } = ctx;
  const m = data.memory || { points: [], cells: [], rows: [] };
  const busy = !!live.busy;
  const button = h("button", {
    class: "nl-button", "data-testid": "nl-free",
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
      h("span", {}, "capacity ", h("b", {}, fmtBytes(live.capacity || 0)))),
    memoryBar(live, "nl-mem-bar"),
    sparkline(m.points, live.busy && live.t !== undefined
      ? m.cells.concat([{ cell: live.cell ?? "?", start_s: live.t - (live.elapsed_s || 0), end_s: live.t }])
      : m.cells, ctx.running),
    h("div", { class: "nl-actions" }, button, note, m.freed ? h("pre", { class: "nl-pre" }, m.freed) : null),
    rows.length ? h("div", { class: "nl-scroll" }, table(["cell", "before", "after", "delta", "peak", "wall"], rows))
      : h("div", { class: "nl-muted" }, "no cell has used the device yet"));
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
    h("td", {}, r.shape ? "(" + r.shape.join(", ") + ")" : "?"), h("td", {}, r.dtype || "?"),
    h("td", { class: "nl-num" }, fmtBytes(r.bytes)), h("td", {}, r.requires_grad ? "✓" : ""), h("td", {}, r.held_by)));
  return h("div", {},
    h("div", { class: "nl-numbers" },
      h("span", {}, `${t.rows.length} storages · total `, h("b", { "data-testid": "nl-tensors-total" }, fmtBytes(t.total))),
      h("span", { class: "nl-muted" }, `memory_allocated ${fmtBytes(t.allocated)}`)),
    h("div", { class: "nl-scroll" }, table(
      [th("names", "names"), th("shape", "shape"), th("dtype", "dtype"), th("bytes", "bytes"),
        th("requires_grad", "grad"), th("held_by", "held by")], body)),
    h("div", { class: "nl-muted" }, "refreshed after each cell; the view holds no tensor"));
}

// -- fallbacks ------------------------------------------------------------------------------------
function opRow(r, ui, ctx) {
  const key = r.kind + ":" + r.op;
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
      h("span", {}, ` ${fmtSec(r.host_ns / 1e9)}`), h("span", { class: "nl-muted" }, ` ${r.reason}`),
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
  const rows = scope === "all" ? f.all : f.cell;
  const pick = (s, label) => h("label", {}, h("input", Object.assign({ type: "radio", name: "scope-" + ctx.uid, value: s },
    scope === s ? { checked: "" } : {})), label);
  const radios = [pick("cell", `this cell (In[${f.last ?? "–"}])`), pick("all", "all cells")];
  for (const r of radios) r.querySelector("input").addEventListener("change", (e) => { ui.scope = e.target.value; ctx.rerender(); });
  const shown = sections(data, rows).map(([kind, mine]) => h("div", { class: "nl-section", "data-kind": kind },
    h("div", { class: "nl-subtitle" },
      `${kindTitle(data, kind)}: ${mine.length} ops, ${fmtInt(mine.reduce((a, r) => a + r.count, 0))} calls`),
    mine.map((r) => opRow(r, ui, ctx))));
  const title = (hd.titles || {}).fallbacks || "";
  return h("div", {},
    h("div", { class: "nl-numbers" },
      h("span", {}, "profile ", h("b", { "data-testid": "nl-profile" }, hd.profile || "none")),
      h("span", { class: "nl-muted" }, hd.profile_hint || "")),
    live.busy ? h("div", { class: "nl-running" }, `${cellLabel(live.cell)} running: `,
      h("b", { "data-testid": "nl-live-fallbacks" }, fmtInt(live.fallback_calls)),
      ` ${offDeviceCall(data, live.fallback_calls)} so far`) : null,
    h("div", { class: "nl-filter" }, radios),
    shown.length ? shown : h("div", { class: "nl-muted", "data-testid": "nl-no-fallbacks" },
      `no ${title} in this ${scope === "all" ? "session" : "cell"}`),
    f.callsites ? null : h("div", { class: "nl-muted" }, "call sites are off (%config NeuronLab.callsites = True)"));
}

// -- compiles -------------------------------------------------------------------------------------
function compilesView(ctx) {
  const c = ctx.data.compiles;
  if (!c) return h("div", {}, "…");
  const rows = c.rows.slice().reverse().map((r) => {
    const details = [];
    const k = r.compiles;
    for (const b of k.breaks) details.push(h("div", { class: "nl-break" }, "graph break at ", h("code", {}, siteLabel(b.site)),
      b.site ? h("code", { class: "nl-muted" }, " " + b.site.source) : null, ": " + b.reason));
    for (const x of k.recompiles) details.push(h("div", { class: "nl-recompile" }, `recompile of ${x.code}`,
      x.site ? h("code", {}, " " + siteLabel(x.site)) : null, ": " + x.reason));
    for (const x of k.failures) details.push(h("div", { class: "nl-up" }, "failed: " + x));
    for (const x of r.checks) details.push(h("pre", { class: "nl-pre" }, x));
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
    rows.length ? h("div", { class: "nl-scroll" }, table(
      ["cell", "mode", "graphs", "breaks", "recompiles", "compile", "run", "compile/run", "details"], rows))
      : h("div", { class: "nl-muted" }, "nothing compiled yet: `%%neuron compile` compiles a cell's module calls"));
}

// -- the strip under a running cell ---------------------------------------------------------------------
function stripView(ctx) {
  const { data, live } = ctx;
  return h("div", { class: "nl-strip" },
    h("span", {}, `${live.device || ""} · ${live.mode || ""}`), memoryBar(live, "nl-strip-bar"),
    h("span", {}, fmtBytes(live.allocated || 0) + " / " + fmtBytes(live.capacity || 0)),
    h("span", {}, h("b", {}, fmtInt(live.fallback_calls)), " " + offDeviceCall(data, live.fallback_calls)),
    h("span", { class: "nl-muted" }, live.busy ? `running ${fmtSec(live.elapsed_s || 0)}` : `done in ${fmtSec(live.elapsed_s || 0)}`));
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

  function rerender() {
    const views = model.get("views");
    const data = model.get("data") || {};
    const live = model.get("live") || {};
    if (!ui.tab || !views.includes(ui.tab)) ui.tab = views[0];
    const ctx = { model, data, live, ui, uid, running, rerender };
    const kids = [];
    if (views.length > 1) {
      kids.push(h("div", { class: "nl-tabs" }, views.map((v) => h("button", {
        class: "nl-tab" + (v === ui.tab ? " nl-active" : ""), "data-view": v,
        onclick: () => { ui.tab = v; rerender(); },
      }, ((data.header && data.header.titles) || {})[v] || v)),
      h("span", { class: "nl-status", "data-testid": "nl-status" },
        live.busy ? `${cellLabel(live.cell)} running · ${fmtBytes(live.allocated || 0)} · `
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
  rerender();
  return () => {
    model.off("change:data", onData);
    model.off("change:live", onLive);
    model.off("change:views", rerender);
  };
}

export default { render };
