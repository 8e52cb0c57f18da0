"""The views without a widget frontend: plain text (terminals, CI logs) and self-contained HTML (nbconvert,
frontends without ipywidgets), read from the same snapshot JSON as ``panel.js``.

:data:`RENDERERS` holds one (text, HTML) pair per view. Where a view shows the report's facts it reads them back
into the report model and draws them with the report's renderers: op rows with their call sites are
:func:`~neuron_lab.report.text.op_lines` and :func:`~neuron_lab.report.html.op_table`, tables are
:func:`~neuron_lab.report.html.table`, a cell's memory is a :class:`~neuron_lab.report.model.Memory`.
"""

from __future__ import annotations

from collections.abc import Callable
from html import escape
from typing import Any

from neuron_lab import kinds
from neuron_lab.report.html import op_table, table
from neuron_lab.report.model import Memory, OpRow, Site
from neuron_lab.report.text import op_lines
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
    if live.get("busy"):  # the count is the running cell's, so it says whose
        state = f"In[{live.get('cell') or '?'}] running {format_seconds(live.get('elapsed_s', 0))}: {calls} so far"
    elif live.get("cell"):
        state = f"In[{live.get('cell')}] {format_seconds(live.get('elapsed_s', 0))}: {calls}"
    else:
        state = "idle"
    return (f"neuron_lab · {live.get('device', h.get('device'))} · mode {live.get('mode', h.get('mode'))} · "
            f"{format_size(live.get('allocated', 0))} of {format_size(cap)}{pct} · {state}")


def _site_text(site: dict | None) -> str:
    if site is None:
        return "?"
    s = Site(**site)
    return f"{s.label}: {s.source}"


def _memories(data: dict) -> list[tuple[Any, Memory]]:
    """(cell, memory) of the newest rows."""
    return [(r["cell"], Memory(**r["memory"])) for r in data["memory"]["rows"][-ROWS:]]


def _sections(data: dict) -> list[tuple[kinds.Kind, list[OpRow]]]:
    """The session's op rows in the reports' sections (:func:`neuron_lab.kinds.sections`), the empty ones left out."""
    rows = [OpRow.from_dict(d) for d in data["fallbacks"]["all"]]
    out = [(kind, [r for r in rows if r.kind in members]) for kind, members in kinds.sections()]
    return [(kind, mine) for kind, mine in out if mine]


def _profile(data: dict) -> str:
    h = data["header"]
    return f"profile {h.get('profile') or 'none'}; {h['profile_hint']}"


# -- memory --------------------------------------------------------------------------------------
def _spark(points: list) -> str:
    if not points:
        return ""
    vals = [b for _, b in points[-60:]]
    top = max(vals) or 1
    return "".join(BLOCKS[min(int(v / top * (len(BLOCKS) - 1) + 0.5), len(BLOCKS) - 1)] for v in vals)


def _svg(points: list, cells: list, width: int = 480, height: int = 60) -> str:
    if not points:
        return ""
    t_max = max(points[-1][0], 1e-9)
    top = max(b for _, b in points) or 1
    path = " ".join(f"{i and 'L' or 'M'}{t / t_max * width:.1f},{height - b / top * (height - 4):.1f}"
                    for i, (t, b) in enumerate(points))
    marks = "".join(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="0" y2="{height}" stroke="#bbb" stroke-dasharray="2,2"/>'
                    for x in (c["start_s"] / t_max * width for c in cells))
    return (f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
            f'aria-label="allocated bytes over the session">{marks}<path d="{path}" fill="none" stroke="#e67e22" '
            'stroke-width="1.5"/></svg>')


def _memory_text(data: dict, live: dict) -> str:
    m = data["memory"]
    lines = [f"memory: peak {format_size(live.get('peak', 0))} · timeline {_spark(m['points'])}"]
    lines += [f"  In[{cell}]  {format_size(mem.before):>11} → {format_size(mem.after):>11}  "
              f"{format_delta(mem.delta):>12}  peak {format_size(mem.peak)}" for cell, mem in _memories(data)]
    if m.get("freed"):
        lines.append("  " + m["freed"].splitlines()[0])
    return "\n".join(lines)


def _memory_html(data: dict, live: dict) -> str:
    m = data["memory"]
    rows = [[f"In[{cell}]", format_size(mem.before), format_size(mem.after), format_delta(mem.delta),
             format_size(mem.peak)] for cell, mem in _memories(data)]
    return _svg(m["points"], m["cells"]) + table(["cell", "before", "after", "delta", "peak"], rows)


# -- tensors -------------------------------------------------------------------------------------
def _tensors_text(data: dict, live: dict) -> str:
    t = data["tensors"]
    lines = [f"device tensors: {len(t['rows'])} storages, {format_size(t['total'])} "
             f"(memory_allocated {format_size(t['allocated'])})"]
    for r in t["rows"][:ROWS]:
        shape = "×".join(map(str, r["shape"])) if r.get("shape") is not None else "?"
        lines.append(f"  {format_size(r['bytes']):>11}  {shape:<14} {r.get('dtype') or '?':<9} "
                     f"{r['held_by']:<20} {', '.join(r['names']) or '—'}")
    return "\n".join(lines)


def _tensors_html(data: dict, live: dict) -> str:
    t = data["tensors"]
    rows = [[format_size(r["bytes"]), escape(str(r.get("shape"))), escape(str(r.get("dtype"))),
             "✓" if r.get("requires_grad") else "", escape(r["held_by"]), escape(", ".join(r["names"]))]
            for r in t["rows"][:ROWS]]
    return (f"<b>device tensors</b> {format_size(t['total'])} (memory_allocated {format_size(t['allocated'])})"
            + table(["bytes", "shape", "dtype", "grad", "held by", "names"], rows))


# -- fallbacks -----------------------------------------------------------------------------------
def _fallbacks_text(data: dict, live: dict) -> str:
    lines = [f"{snapshot.TITLES['fallbacks']}, all cells ({_profile(data)}):"]
    sections = _sections(data)
    for kind, rows in sections:
        lines += op_lines(kind.title, rows)
    return "\n".join(lines if sections else [*lines, "  none"])


def _fallbacks_html(data: dict, live: dict) -> str:
    head = f"<b>{escape(snapshot.TITLES['fallbacks'])}, all cells</b> ({escape(_profile(data))})"
    return head + "".join(op_table(f"{kind.title}: {sum(r.count for r in rows):,} calls" if kind.off_device
                                   else kind.title, rows) for kind, rows in _sections(data))


# -- compiles ------------------------------------------------------------------------------------
def _compiles_text(data: dict, live: dict) -> str:
    c = data["compiles"]
    tot = c["totals"]
    lines = [f"compiles: {count(tot['compiles'], 'frame')}, {count(tot['graph_breaks'], 'graph break')}, "
             f"{count(tot['recompiles'], 'recompile')}"]
    for r in c["rows"][-ROWS:]:
        rc = r["compiles"]
        lines.append(f"  In[{r['cell']}] {count(rc['graphs'], 'graph')}, compile {format_seconds(rc['compile_s'])}, "
                     f"run {format_seconds(r['run_s'])}")
        lines += [f"    break at {_site_text(b['site'])}: {b['reason']}" for b in rc["breaks"]]
        lines += [f"    recompile of {x['code']} ({_site_text(x['site'])}): {x['reason']}" for x in rc["recompiles"]]
        lines += [f"    compile failed: {x}" for x in rc["failures"]]
        lines += [f"    {x.splitlines()[0]}" for x in r["checks"] if x]
    return "\n".join(lines)


def _compiles_html(data: dict, live: dict) -> str:
    rows = [[f"In[{r['cell']}]", str(r["compiles"]["graphs"]), format_seconds(r["compiles"]["compile_s"]),
             format_seconds(r["run_s"]),
             "<br>".join(escape(f"{_site_text(b['site'])}: {b['reason']}") for b in r["compiles"]["breaks"]),
             "<br>".join(escape(f"{x['code']}: {x['reason']}") for x in r["compiles"]["recompiles"])]
            for r in data["compiles"]["rows"][-ROWS:]]
    return "<b>compiles</b>" + table(["cell", "graphs", "compile", "run", "breaks", "recompiles"], rows)


RENDERERS: dict[str, tuple[Renderer, Renderer]] = {
    "memory": (_memory_text, _memory_html), "tensors": (_tensors_text, _tensors_html),
    "fallbacks": (_fallbacks_text, _fallbacks_html), "compiles": (_compiles_text, _compiles_html)}


def _shown(data: dict, views: list[str]) -> list[str]:
    return [v for v in views if v in RENDERERS and v in data]


def render_text(data: dict, live: dict, views: list[str]) -> str:
    return "\n".join([_strip_line(data, live), *(RENDERERS[v][0](data, live) for v in _shown(data, views))])


def render_html(data: dict, live: dict, views: list[str]) -> str:
    strip = f"<div style='font-family:monospace;font-size:12px'>{escape(_strip_line(data, live))}</div>"
    return ("<div class='neuron-lab-static'>" + strip
            + "".join(f"<div>{RENDERERS[v][1](data, live)}</div>" for v in _shown(data, views)) + "</div>")


class StaticView:
    """A view for frontends without widgets: shown once, then updated in place after each cell.

    In a kernel the update is an ``update_display_data`` (the saved notebook keeps the latest);
    a terminal prints it once, since it cannot update in place.
    """

    def __init__(self, hub: Any, views: list[str]) -> None:
        self.hub, self.views = hub, list(views)
        self.handle: Any = None
        self.data: dict = {}
        self.live: dict = {}
        self._refresh()

    def _refresh(self) -> None:
        self.data = snapshot.build(self.hub.session, self.views)
        self.live = snapshot.live(self.hub.session)

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
