"""The views without a widget frontend: plain text (terminals, CI logs) and self-contained HTML (nbconvert,
frontends without ipywidgets), read from the same snapshot JSON as ``panel.js``.

:data:`RENDERERS` holds one (text, HTML) pair per view. Where a view shows the report's facts it reads them back
into the report model and draws them with the report's renderers: op rows with their call sites are
:func:`~neuron_lab.report.text.op_sections` and :func:`~neuron_lab.report.html.op_sections_html`, tables are
:func:`~neuron_lab.report.html.table`, a cell's memory is a :class:`~neuron_lab.report.model.Memory`.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Callable
from html import escape
from typing import Any

from neuron_lab import kinds
from neuron_lab.report.html import escaped, op_sections_html, table
from neuron_lab.report.model import Memory, OpRow, Site
from neuron_lab.report.rows import Table
from neuron_lab.report.text import columns, op_sections
from neuron_lab.units import count, format_delta, format_seconds, format_size
from neuron_lab.widgets import snapshot

ROWS = 20  # rows per table in the static views
BLOCKS = "▁▂▃▄▅▆▇█"

Renderer = Callable[[dict, dict], str]  # (data, live) -> one view as text, or as an HTML fragment


def _strip_line(data: dict, live: dict) -> str:
    h = data.get("header", {})
    cap = live.get("capacity") or 0
    pct = f" ({100 * live.get('allocated', 0) / cap:.1f}%)" if cap else ""
    calls = count(live.get("fallback_calls", 0), kinds.KINDS[kinds.FALLBACK].call)
    calls += f", {live['syncs_text']}" if live.get("syncs_text") else ""
    if live.get("busy"):  # the count is the running cell's, so it says whose
        state = f"In[{live.get('cell') or '?'}] running {format_seconds(live.get('elapsed_s', 0))}: {calls} so far"
        if live.get("compiling"):
            state += f" · {live['compiling']['text']}"
    elif live.get("cell"):
        state = f"In[{live.get('cell')}] {format_seconds(live.get('elapsed_s', 0))}: {calls}"
    else:
        state = "idle"
    return (f"neuron_lab · {live.get('device', h.get('device'))} · mode {live.get('mode', h.get('mode'))} · "
            f"{format_size(live.get('allocated', 0))} of {live.get('capacity_text') or format_size(cap)}{pct} · "
            f"{state}")



def _site_text(site: dict | None) -> str:
    if site is None:
        return "?"
    s = Site(**site)
    return f"{s.label}: {s.source}"


def _cut(rows: list, noun: str, *, newest: bool = False) -> tuple[list, str]:
    """The :data:`ROWS` rows a static view shows (the first, or the ``newest``) and the line that says how many it
    left out ("" when none): a view that says "27 storages" and lists 20 must not read as complete."""
    if len(rows) <= ROWS:
        return rows, ""
    left = count(len(rows) - ROWS, ("earlier " if newest else "more ") + noun)
    return (rows[-ROWS:] if newest else rows[:ROWS]), f"… {left}"


def _note_html(line: str) -> str:
    """A grey line under a view (none for "")."""
    return f'<div style="color:#666">{escape(line)}</div>' if line else ""


def _memories(data: dict) -> tuple[list[tuple[Any, Memory]], str]:
    """(cell, memory) of the newest rows, and the line saying how many older ones it left out."""
    rows, left = _cut(data["memory"]["rows"], "cell", newest=True)
    return [(r["cell"], Memory(**r["memory"])) for r in rows], left


def _sections(data: dict) -> list[tuple[kinds.Kind, list[OpRow]]]:
    """The session's op rows in the reports' sections (:func:`neuron_lab.kinds.sections`), the empty ones left out."""
    rows = [OpRow.from_dict(d) for d in data["fallbacks"]["all"]]
    out = [(kind, [r for r in rows if r.kind in members]) for kind, members in kinds.sections()]
    return [(kind, mine) for kind, mine in out if mine]


def _coverage(data: dict) -> str:
    h = data["header"]
    return f"coverage {h.get('coverage') or 'none'}; {h['coverage_hint']}"


# -- memory --------------------------------------------------------------------------------------
_SPARK_BARS = 60


def _spark(points: list, peak: int) -> str:
    """The session's memory in at most 60 bars, each the highest of its stretch of samples, scaled to the peak that
    the line names beside it (1 KiB in use after a 95 MiB peak is a low bar, not a full one)."""
    vals = [b for _, b in points]
    if not vals:
        return ""
    n, width = len(vals), min(len(vals), _SPARK_BARS)
    bars = [max(vals[i * n // width:(i + 1) * n // width]) for i in range(width)]
    top = max(peak, *bars) or 1
    return "".join(BLOCKS[min(int(v / top * (len(BLOCKS) - 1) + 0.5), len(BLOCKS) - 1)] for v in bars)


_UNITS = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10), ("B", 1))
_LABEL_PX = 6  # a label character's width at 10px, for the overlap test


def _ticks(top: float, n: int = 4) -> list[float]:
    """About ``n`` round tick values from 0 to ``top``."""
    raw = top / n
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    return [i * step for i in range(int(top / step) + 1)]


def _svg(points: list, cells: list, marks: list, peak: int, width: int = 560, height: int = 150) -> str:
    """The memory timeline as SVG, the widget's chart by time: axes with units, labelled cell bands (a label that
    does not fit or would overlap the one before is left out; the band's tooltip names it), OOM and peak marks."""
    if not points:
        return ""
    left, right, top, bottom = 64, 8, 14, 32
    pw, ph = width - left - right, height - top - bottom
    t0, t1 = points[0][0], max(points[-1][0], points[0][0] + 1e-3)
    unit, scale = next((u, s) for u, s in _UNITS if max(peak, 1) >= s)
    y_top = max(peak, max(b for _, b in points), 1) / scale * 1.1

    def x(t: float) -> float:
        return left + (min(max(t, t0), t1) - t0) / (t1 - t0) * pw

    def y(b: float) -> float:
        return top + ph - b / scale / y_top * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="device memory allocated over the session" '
           'style="font:10px sans-serif">']
    right_edge = -1.0
    for c in cells:
        x0, x1 = x(c["start_s"]), x(c["end_s"])
        label = f"In[{c['cell']}]"
        out.append(f'<rect x="{x0:.1f}" y="{top}" width="{max(x1 - x0, 1):.1f}" height="{ph}" '
                   f'fill="rgba(52,152,219,0.14)"><title>{escape(label)}</title></rect>')
        if x1 - x0 >= len(label) * _LABEL_PX + 4 and x0 >= right_edge:
            out.append(f'<text x="{x0 + 2:.1f}" y="{top + 10}" fill="#555">{escape(label)}</text>')
            right_edge = x0 + len(label) * _LABEL_PX + 4
    for v in _ticks(y_top / 1.1):
        at = y(v * scale)
        out.append(f'<line x1="{left - 3}" x2="{left + pw}" y1="{at:.1f}" y2="{at:.1f}" stroke="#eee"/>'
                   f'<text x="{left - 5}" y="{at + 3:.1f}" text-anchor="end">{v:g} {unit}</text>')
    for v in _ticks(t1 - t0, 5):
        out.append(f'<text x="{x(t0 + v):.1f}" y="{top + ph + 13}" text-anchor="middle">{v:g} s</text>')
    path = " ".join(f"{'L' if i else 'M'}{x(t):.1f},{y(b):.1f}" for i, (t, b) in enumerate(points))
    out.append(f'<path d="{path}" fill="none" stroke="#e67e22" stroke-width="1.5"/>')
    out.append(f'<line x1="{left}" x2="{left + pw}" y1="{y(peak):.1f}" y2="{y(peak):.1f}" stroke="#c0392b" '
               f'stroke-dasharray="4,3"/><text x="{left + 4}" y="{y(peak) - 3:.1f}" '
               f'fill="#c0392b">peak {format_size(peak)}</text>')
    for m in marks:  # the label on the side with room
        at = x(m["t_s"])
        side = f'x="{at - 3:.1f}" text-anchor="end"' if at > left + pw - 40 else f'x="{at + 3:.1f}"'
        out.append(f'<line x1="{at:.1f}" x2="{at:.1f}" y1="{top}" y2="{top + ph}" stroke="#c0392b" stroke-width="2">'
                   f'<title>{escape(m["label"])}</title></line><text {side} y="{top + ph - 3}" fill="#c0392b">'
                   f'{"OOM" if m["kind"] == "oom" else escape(m["kind"])}</text>')
    out.append(f'<line x1="{left}" x2="{left}" y1="{top}" y2="{top + ph}" stroke="#999"/>'
               f'<line x1="{left}" x2="{left + pw}" y1="{top + ph}" y2="{top + ph}" stroke="#999"/>'
               f'<text x="{left + pw / 2:.1f}" y="{height - 4}" text-anchor="middle" fill="#666">'
               'seconds since the session started</text>'
               f'<text transform="translate(10,{top + ph / 2:.1f}) rotate(-90)" text-anchor="middle" fill="#666">'
               f'allocated ({unit})</text></svg>')
    return "".join(out)


def _chart(svg: str) -> str:
    """The SVG as an image: sanitised HTML (JupyterLab's for an untrusted notebook) drops ``<svg>`` but keeps its
    text, mashed into one line; an ``<img>`` of it is kept, or reads as its ``alt``."""
    if not svg:
        return ""
    src = "data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode()
    return f'<img src="{src}" alt="chart: device memory allocated over the session" style="max-width:100%">'


# -- ranks (in the memory view) -----------------------------------------------------------------------
def _rank_tables(live: dict) -> list[tuple[str, Table]]:
    """Each host's heading and its ranks' table (``live["ranks"]``, :func:`snapshot.ranks`)."""
    return [(g["head"], Table(list(snapshot.RANK_COLUMNS), [
        [str(r["rank"]), r["device"], *((format_size(r["allocated"]), format_size(r["peak"]), r["capacity_text"])
                                        if "allocated" in r else ("?",) * 3),
         f"{r.get('fallback_calls', 0):,}", r["status_text"]] for r in g["rows"]]))
        for g in live["ranks"]["hosts"]] if live.get("ranks") else []


def _ranks_text(live: dict) -> list[str]:
    tables = _rank_tables(live)
    return [live["ranks"]["head"], *(line for head, t in tables for line in ["  " + head, *columns(t, "    ")])
            ] if tables else []


def _ranks_html(live: dict) -> str:
    tables = _rank_tables(live)
    return (f"<div data-testid='nl-ranks'><b>{escape(live['ranks']['head'])}</b>"
            + "".join(f"<div>{escape(head)}</div>" + table(t.header, escaped(t.rows)) for head, t in tables)
            + "</div>") if tables else ""


def _memory_text(data: dict, live: dict) -> str:
    m = data["memory"]
    memories, left = _memories(data)
    peak = live.get("peak", 0)
    lines = [f"memory: peak {format_size(peak)} · timeline {_spark(m['points'], peak)}", *_ranks_text(live)]
    lines += [f"  {left}"] if left else []
    lines += [f"  In[{cell}]  {format_size(mem.before):>11} → {format_size(mem.after):>11}  "
              f"{format_delta(mem.delta):>12}  peak {format_size(mem.peak)}" for cell, mem in memories]
    if m.get("sampling"):
        lines.append("  " + m["sampling"])
    if m.get("freed"):
        lines.append("  " + m["freed"].splitlines()[0])
    return "\n".join(lines)


def _memory_html(data: dict, live: dict) -> str:
    m = data["memory"]
    memories, left = _memories(data)
    rows = [[f"In[{cell}]", format_size(mem.before), format_size(mem.after), format_delta(mem.delta),
             format_size(mem.peak)] for cell, mem in memories]
    peak = max([live.get("peak", 0), *(mem.peak for _, mem in memories)])
    return (_ranks_html(live) + _chart(_svg(m["points"], m["cells"], m.get("marks", []), peak))
            + _note_html(m.get("sampling") or "") + _note_html(left)
            + table(["cell", "before", "after", "delta", "peak"], rows))


# -- tensors -------------------------------------------------------------------------------------
def _tensors_text(data: dict, live: dict) -> str:
    t = data["tensors"]
    lines = [f"device tensors: {len(t['rows'])} storages, {format_size(t['total'])} "
             f"(memory_allocated {format_size(t['allocated'])})"]
    shown, left = _cut(t["rows"], "storage")
    for r in shown:
        lines.append(f"  {format_size(r['bytes']):>11}  {r['shape_text']:<14} {r.get('dtype') or '?':<9} "
                     f"{r['held_by']:<20} {', '.join(r['names']) or '—'}")
    return "\n".join([*lines, f"  {left}"] if left else lines)


def _tensors_html(data: dict, live: dict) -> str:
    t = data["tensors"]
    shown, left = _cut(t["rows"], "storage")
    rows = [[format_size(r["bytes"]), escape(r["shape_text"]), escape(str(r.get("dtype") or "?")),
             "✓" if r.get("requires_grad") else "", escape(r["held_by"]), escape(", ".join(r["names"]))]
            for r in shown]
    return (f"<b>device tensors</b> {format_size(t['total'])} (memory_allocated {format_size(t['allocated'])})"
            + table(["bytes", "shape", "dtype", "grad", "held by", "names"], rows) + _note_html(left))


# -- fallbacks -----------------------------------------------------------------------------------
def _fallbacks_text(data: dict, live: dict) -> str:
    lines = [f"{snapshot.TITLES['fallbacks']}, all cells ({_coverage(data)}):"]
    sections = _sections(data)
    return "\n".join([*lines, *op_sections(sections)] if sections else [*lines, "  none"])


def _fallbacks_html(data: dict, live: dict) -> str:
    head = f"<b>{escape(snapshot.TITLES['fallbacks'])}, all cells</b> ({escape(_coverage(data))})"
    return head + op_sections_html(_sections(data))


# -- compiles ------------------------------------------------------------------------------------
def _compiles_text(data: dict, live: dict) -> str:
    c = data["compiles"]
    tot = c["totals"]
    lines = [f"compiles: {count(tot['compiles'], 'frame')}, {count(tot['graph_breaks'], 'graph break')}, "
             f"{count(tot['recompiles'], 'recompile')}"]
    shown, left = _cut(c["rows"], "cell", newest=True)
    lines += [f"  {left}"] if left else []
    for r in shown:
        rc = r["compiles"]
        lines.append(f"  In[{r['cell']}] {count(rc['graphs'], 'graph')}, compile {format_seconds(rc['compile_s'])}, "
                     f"run {format_seconds(r['run_s'])}")
        lines += [f"    break at {_site_text(b['site'])}: {b['reason']}" for b in rc["breaks"]]
        lines += [f"    recompile of {x['code']} ({_site_text(x['site'])}): {x['reason']}" for x in rc["recompiles"]]
        lines += [f"    compile failed: {x}" for x in rc["failures"]]
        lines += [f"    {x}" for x in r["checks"]]
    return "\n".join(lines)


def _compiles_html(data: dict, live: dict) -> str:
    shown, left = _cut(data["compiles"]["rows"], "cell", newest=True)
    rows = [[f"In[{r['cell']}]", str(r["compiles"]["graphs"]), format_seconds(r["compiles"]["compile_s"]),
             format_seconds(r["run_s"]),
             "<br>".join(escape(f"{_site_text(b['site'])}: {b['reason']}") for b in r["compiles"]["breaks"]),
             "<br>".join(escape(f"{x['code']}: {x['reason']}") for x in r["compiles"]["recompiles"])]
            for r in shown]
    return ("<b>compiles</b>" + _note_html(left)
            + table(["cell", "graphs", "compile", "run", "breaks", "recompiles"], rows))


RENDERERS: dict[str, tuple[Renderer, Renderer]] = {
    "memory": (_memory_text, _memory_html), "tensors": (_tensors_text, _tensors_html),
    "fallbacks": (_fallbacks_text, _fallbacks_html), "compiles": (_compiles_text, _compiles_html)}


def _shown(data: dict, views: list[str]) -> list[str]:
    return [v for v in views if v in RENDERERS and v in data]


def stamp(data: dict) -> str:
    """What stands in for a live view where the widget cannot run (an nbconvert export, an untrusted notebook)
    says it is a snapshot, and of when (:func:`~neuron_lab.widgets.snapshot.as_of`)."""
    return data["as_of"]["stamp"]


def render_text(data: dict, live: dict, views: list[str], *, stamped: bool = False) -> str:
    """The views as text; ``stamped``: a last line says it is a snapshot (:func:`stamp`)."""
    return "\n".join([_strip_line(data, live), *(RENDERERS[v][0](data, live) for v in _shown(data, views)),
                      *([stamp(data)] if stamped else [])])


def render_html(data: dict, live: dict, views: list[str], *, stamped: bool = False) -> str:
    """The views as one self-contained HTML fragment; ``stamped``: it starts by saying it is a snapshot."""
    head = (f"<div data-testid='nl-snapshot-stamp' style='color:#777;font-style:italic'>{escape(stamp(data))}"
            "</div>" if stamped else "")
    strip = f"<div style='font-family:monospace;font-size:12px'>{escape(_strip_line(data, live))}</div>"
    return ("<div class='neuron-lab-static'>" + head + strip
            + "".join(f"<div>{RENDERERS[v][1](data, live)}</div>" for v in _shown(data, views)) + "</div>")


class StaticView:
    """A view for frontends without widgets: shown once, then updated in place after each cell (``follow``)
    or only at the end of the cell that opened it (a snapshot).

    In a kernel the update is an ``update_display_data`` (the saved notebook keeps the latest);
    a terminal prints it once, since it cannot update in place.
    """

    def __init__(self, hub: Any, views: list[str], *, follow: bool = True) -> None:
        self.hub, self.views, self.follow = hub, list(views), follow
        self.handle: Any = None
        self.data: dict = {}
        self.live: dict = {}
        self._refresh()

    def _refresh(self) -> None:
        self.data = snapshot.build(self.hub.session, self.views)
        self.live = self.hub.live(settle=True)

    def _bundle(self) -> dict[str, str]:
        return {"text/plain": render_text(self.data, self.live, self.views),
                "text/html": render_html(self.data, self.live, self.views)}

    def _ipython_display_(self) -> None:
        if getattr(self.hub.session.shell, "kernel", None) is None:
            print(render_text(self.data, self.live, self.views))  # a terminal cannot update in place
            return
        from IPython.display import display

        self.handle = display(self._bundle(), raw=True, display_id=True)

    def update(self) -> None:
        self._refresh()
        if self.handle is not None:
            self.handle.update(self._bundle(), raw=True)

    def __repr__(self) -> str:
        return render_text(self.data, self.live, self.views)
