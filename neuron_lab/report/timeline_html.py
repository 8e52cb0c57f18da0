"""The profile's timeline as a self-contained SVG: lanes of spans coloured by kind, each device's memory curve, a time
axis; a small inline script makes it zoomable (wheel, around the pointer) and pannable (drag), double-click resets.

The SVG is drawn here, server-side, so an nbconvert export or a viewer that runs no script still shows the whole
window. The script only moves what is drawn: every span carries its start and duration (``data-t``, ``data-d``, in
ns) and each memory curve its points, and the script re-places them for the visible range. JupyterLab's sanitizer
drops SVG from an untrusted output: there a note (:data:`UNTRUSTED`) stands in for it.
"""

from __future__ import annotations

import json
import math
import uuid
from html import escape

from neuron_lab.kinds import COLLECTIVE, FALLBACK, HOST
from neuron_lab.report.model import COPY, KERNEL, MemoryCurve, ProfiledTimeline, Span
from neuron_lab.units import count, format_seconds, format_size

WIDTH = 960  # px: label column + plot
LABEL_W = 120
PLOT_W = WIDTH - LABEL_W - 10
AXIS_H = 22
LANE_H = 22
MEMORY_H = 56
MIN_SPAN_PX = 1.0  # a span never narrower than this, so short kernels stay visible
COLOURS = {KERNEL: "#4c78a8", COPY: "#54a24b", COLLECTIVE: "#72b7b2", FALLBACK: "#e45756", HOST: "#f58518"}
LEGEND = {KERNEL: "native kernel", COPY: "copy", COLLECTIVE: "collective", FALLBACK: "CPU fallback", HOST: "host op"}
MEMORY_COLOUR = "#7f5fbf"
_UNITS = ((1e9, "s"), (1e6, "ms"), (1e3, "µs"), (1.0, "ns"))
UNTRUSTED = "If no timeline is drawn here, this output is not trusted: run the cell again, or trust the notebook."


def ticks(t0: float, t1: float, target: int = 8) -> list[tuple[float, str]]:
    """Axis ticks for the range [t0, t1] ns: a 1-2-5 step giving about ``target`` ticks, labelled in the unit of
    the range's end with the decimals the step needs ("7.5 ms", not "7500 µs")."""
    raw = max(t1 - t0, 1.0) / target
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    scale, unit = next((s, u) for s, u in _UNITS if max(t1, step) >= s)
    decimals = max(0, -math.floor(math.log10(step / scale) + 1e-9))
    first = math.ceil(t0 / step) * step
    n = int((t1 - first) // step) + 1
    return [(first + i * step, f"{(first + i * step) / scale:.{decimals}f} {unit}") for i in range(n)]


def _x(t: float, duration: int) -> float:
    return LABEL_W + t / max(duration, 1) * PLOT_W


def _tooltip(s: Span) -> str:
    what = LEGEND.get(s.kind, s.kind)
    at = f"at {format_seconds(s.start_ns / 1e9)}"
    if s.events == 1:
        return f"{s.name} ({what}): {format_seconds(s.dur_ns / 1e9)} {at}"
    return (f"{s.name} and {count(s.events - 1, 'more event')} ({what}, merged): busy "
            f"{format_seconds(s.busy_ns / 1e9)} of {format_seconds(s.dur_ns / 1e9)} {at}")


def _span(s: Span, y: int, duration: int) -> str:
    x, w = _x(s.start_ns, duration), max(s.dur_ns / max(duration, 1) * PLOT_W, MIN_SPAN_PX)
    return (f"<rect class='nlt-span' data-kind='{escape(s.kind)}' data-t='{s.start_ns}' data-d='{s.dur_ns}' "
            f"x='{x:.2f}' y='{y + 3}' width='{w:.2f}' height='{LANE_H - 6}' fill='{COLOURS.get(s.kind, '#888')}'>"
            f"<title>{escape(_tooltip(s))}</title></rect>")


def _memory_path(m: MemoryCurve, y: int, duration: int) -> str:
    """A filled step curve, from the window's start to its end, scaled to the curve's own peak."""
    top = max(m.peak, 1)
    points = [*m.points, (duration, m.points[-1][1])] if m.points else []
    d = ""
    for i, (t, b) in enumerate(points):
        px, py = _x(t, duration), y + MEMORY_H - 4 - b / top * (MEMORY_H - 12)
        d += f"H{px:.2f}V{py:.2f}" if i else f"M{px:.2f},{py:.2f}"
    if d:
        d += f"V{y + MEMORY_H - 4}H{LABEL_W}Z"
    data = escape(json.dumps([[t, b] for t, b in m.points]))
    return (f"<path class='nlt-memory' data-device='{escape(m.device)}' data-peak='{top}' data-y='{y}' "
            f"data-points='{data}' d='{d}' fill='{MEMORY_COLOUR}' fill-opacity='0.25' stroke='{MEMORY_COLOUR}'>"
            f"<title>{escape(m.device)} allocated: peak {format_size(m.peak)}</title></path>")


def _axis(duration: int, height: int) -> str:
    out = []
    for t, label in ticks(0, duration):
        x = _x(t, duration)
        out.append(f"<line x1='{x:.2f}' x2='{x:.2f}' y1='{AXIS_H - 4}' y2='{height}' stroke='#ddd'/>"
                   f"<text class='nlt-tick' x='{x:.2f}' y='{AXIS_H - 8}' text-anchor='middle'>{escape(label)}</text>")
    return "".join(out)


def _legend(tl: ProfiledTimeline) -> str:
    kinds = [k for k in COLOURS if any(s.kind == k for x in tl.lanes for s in x.spans)]
    items = [f"<span style='display:inline-block;width:10px;height:10px;background:{COLOURS[k]};"
             f"margin:0 3px 0 10px'></span>{escape(LEGEND[k])}" for k in kinds]
    if tl.memory:
        items.append(f"<span style='display:inline-block;width:10px;height:10px;background:{MEMORY_COLOUR};"
                     f"opacity:0.5;margin:0 3px 0 10px'></span>allocated device memory")
    return "".join(items)


def timeline_html(tl: ProfiledTimeline, caption: str) -> str:
    """The timeline's SVG and its zoom script, with ``caption`` above; ids unique to this output."""
    uid = "nlt-" + uuid.uuid4().hex[:12]
    rows, y = [], AXIS_H
    for lane in tl.lanes:
        rows.append(f"<g class='nlt-lane' data-lane='{escape(lane.name)}'>"
                    f"<text x='4' y='{y + LANE_H - 7}'>{escape(lane.name)}</text>"
                    f"<g clip-path='url(#{uid}-clip)'>" + "".join(_span(s, y, tl.duration_ns) for s in lane.spans)
                    + "</g></g>")
        y += LANE_H
    for m in tl.memory:
        rows.append(f"<g class='nlt-memory-lane' data-lane='{escape(m.device)} memory'>"
                    f"<text x='4' y='{y + 16}'>{escape(m.device)} memory</text>"
                    f"<text x='4' y='{y + 30}' fill='#666'>peak {escape(format_size(m.peak))}</text>"
                    f"<g clip-path='url(#{uid}-clip)'>{_memory_path(m, y, tl.duration_ns)}</g></g>")
        y += MEMORY_H
    height = y + 4
    svg = (f"<svg id='{uid}' class='nlt-svg' xmlns='http://www.w3.org/2000/svg' width='{WIDTH}' height='{height}' "
           f"viewBox='0 0 {WIDTH} {height}' data-duration='{tl.duration_ns}' data-label='{LABEL_W}' "
           f"data-plot='{PLOT_W}' data-axis='{AXIS_H}' data-memory-height='{MEMORY_H}' data-min-width='{MIN_SPAN_PX}' "
           f"style='display:block;font:11px monospace;cursor:grab;user-select:none;background:#fff'>"
           f"<clipPath id='{uid}-clip'><rect x='{LABEL_W}' y='0' width='{PLOT_W}' height='{height}'/></clipPath>"
           f"<g class='nlt-axis'>{_axis(tl.duration_ns, height)}</g>{''.join(rows)}</svg>")
    hint = "wheel: zoom around the pointer, drag: pan, double-click: whole window"
    # An untrusted output in JupyterLab is sanitized: the SVG's elements go, their text would stay. The zero font
    # size hides that text there (the SVG sets its own); the note says why nothing is drawn, and the script,
    # which runs only where the SVG is shown, removes it.
    return (f"<div class='neuron-lab-timeline'><div><b>{escape(caption)}</b>"
            f"<span style='color:#666;margin-left:8px'>({hint})</span></div>"
            f"<div id='{uid}-untrusted' class='nlt-untrusted' style='color:#666'>{UNTRUSTED}</div>"
            f"<div>{_legend(tl)}</div><div class='nlt-box' style='font-size:0px;line-height:0px'>{svg}</div>"
            f"<script>{_SCRIPT.replace('__UID__', uid)}</script></div>")


# The zoom: the same 1-2-5 ticks as :func:`ticks`, re-placing spans and curves for the visible range [t0, t1] ns;
# the layout's sizes come from the SVG's data attributes.
_SCRIPT = """(function () {
const svg = document.getElementById('__UID__');
document.getElementById('__UID__-untrusted')?.remove();
if (!svg || svg.dataset.zoomable) return;
svg.dataset.zoomable = '1';
const NS = 'http://www.w3.org/2000/svg', c = svg.dataset;
const L = +c.label, W = +c.plot, AXIS_H = +c.axis, MH = +c.memoryHeight, MINW = +c.minWidth;
const D = Math.max(+svg.dataset.duration, 1), H = +svg.getAttribute('height');
const UNITS = [[1e9, 's'], [1e6, 'ms'], [1e3, '\\u00b5s'], [1, 'ns']];
let t0 = 0, t1 = D;
const X = (t) => L + (t - t0) / (t1 - t0) * W;
function ticks() {
  const raw = Math.max(t1 - t0, 1) / 8, mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw);
  const [scale, unit] = UNITS.find(([s]) => Math.max(t1, step) >= s);
  const dec = Math.max(0, -Math.floor(Math.log10(step / scale) + 1e-9)), out = [];
  for (let t = Math.ceil(t0 / step) * step; t <= t1; t += step) out.push([t, (t / scale).toFixed(dec) + ' ' + unit]);
  return out;
}
function draw() {
  const axis = svg.querySelector('.nlt-axis');
  axis.replaceChildren();
  for (const [t, label] of ticks()) {
    const line = document.createElementNS(NS, 'line'), text = document.createElementNS(NS, 'text');
    const x = X(t).toFixed(2);
    Object.entries({x1: x, x2: x, y1: AXIS_H - 4, y2: H, stroke: '#ddd'}).forEach(([k, v]) => line.setAttribute(k, v));
    Object.entries({x: x, y: AXIS_H - 8, 'text-anchor': 'middle', class: 'nlt-tick'})
      .forEach(([k, v]) => text.setAttribute(k, v));
    text.textContent = label;
    axis.append(line, text);
  }
  for (const r of svg.querySelectorAll('.nlt-span')) {
    r.setAttribute('x', X(+r.dataset.t).toFixed(2));
    r.setAttribute('width', Math.max(+r.dataset.d / (t1 - t0) * W, MINW).toFixed(2));
  }
  for (const p of svg.querySelectorAll('.nlt-memory')) {
    const pts = JSON.parse(p.dataset.points), y = +p.dataset.y, top = +p.dataset.peak;
    if (!pts.length) continue;
    pts.push([D, pts[pts.length - 1][1]]);
    let d = '';
    pts.forEach(([t, b], i) => {
      const px = X(t).toFixed(2), py = (y + MH - 4 - b / top * (MH - 12)).toFixed(2);
      d += i ? 'H' + px + 'V' + py : 'M' + px + ',' + py;
    });
    p.setAttribute('d', d + 'V' + (y + MH - 4) + 'H' + X(0).toFixed(2) + 'Z');
  }
}
function at(ev) {
  const pt = svg.createSVGPoint();
  pt.x = ev.clientX; pt.y = ev.clientY;
  return pt.matrixTransform(svg.getScreenCTM().inverse()).x;
}
let pending = false;
function show(a, b) {  // the range now, drawn at the next frame: a burst of wheel events draws once
  const span = Math.min(Math.max(b - a, Math.min(D, 100)), D);
  a = Math.min(Math.max(a, 0), D - span);
  t0 = a; t1 = a + span;
  if (!pending) { pending = true; requestAnimationFrame(() => { pending = false; draw(); }); }
}
svg.addEventListener('wheel', (ev) => {
  const x = at(ev);
  if (x < L) return;
  ev.preventDefault();
  const f = Math.exp(ev.deltaY * 0.002), tp = t0 + (x - L) / W * (t1 - t0);
  show(tp - (tp - t0) * f, tp + (t1 - tp) * f);
}, {passive: false});
let drag = null;
svg.addEventListener('pointerdown', (ev) => {
  drag = {x: at(ev), t0: t0, t1: t1};
  svg.setPointerCapture(ev.pointerId);
  svg.style.cursor = 'grabbing';
});
svg.addEventListener('pointermove', (ev) => {
  if (!drag) return;
  const dt = (at(ev) - drag.x) / W * (drag.t1 - drag.t0);
  show(drag.t0 - dt, drag.t1 - dt);
});
const end = () => { drag = null; svg.style.cursor = 'grab'; };
svg.addEventListener('pointerup', end);
svg.addEventListener('pointercancel', end);
svg.addEventListener('dblclick', () => show(0, D));
})();"""
