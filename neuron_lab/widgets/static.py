"""The views without a widget frontend: plain text (terminals, CI logs) and self-contained HTML
(nbconvert, frontends without ipywidgets), read from the same snapshot dicts as ``panel.js``."""

from __future__ import annotations

from html import escape
from typing import Any

from neuron_lab.units import count, format_delta, format_seconds, format_size

ROWS = 20  # rows per table in the static views
BLOCKS = "▁▂▃▄▅▆▇█"
_TABLE = 'style="border-collapse:collapse;font-size:12px;margin:2px 0"'
_TD = 'style="padding:1px 8px;text-align:left;vertical-align:top"'
_KIND_TITLES = (("fallback", "CPU fallbacks"), ("host", "host ops"), ("downcast", "64-bit downcasts"))


def _strip_line(data: dict, live: dict) -> str:
    h = data.get("header", {})
    cap = live.get("capacity") or 0
    pct = f" ({100 * live.get('allocated', 0) / cap:.1f}%)" if cap else ""
    calls = count(live.get("fallback_calls", 0), "CPU fallback call")
    if live.get("busy"):  # the count is the running cell's, so it says whose
        state = f"In[{live.get('cell') or '?'}] running {format_seconds(live.get('elapsed_s', 0))}: {calls} so far"
    elif live.get("cell"):
        state = f"In[{live.get('cell')}] {format_seconds(live.get('elapsed_s', 0))}: {calls}"
    else:
        state = "idle"
    return (f"neuron_lab · {live.get('device', h.get('device'))} · mode {live.get('mode', h.get('mode'))} · "
            f"{format_size(live.get('allocated', 0))} of {format_size(cap)}{pct} · {state}")


def _spark(points: list) -> str:
    if not points:
        return ""
    vals = [b for _, b in points[-60:]]
    top = max(vals) or 1
    return "".join(BLOCKS[min(int(v / top * (len(BLOCKS) - 1) + 0.5), len(BLOCKS) - 1)] for v in vals)


def _site_text(s: dict) -> str:
    return f"{s['label']}: {s['source']}" if s else "?"


def _fallback_rows(data: dict) -> list[dict]:
    return data.get("fallbacks", {}).get("all", [])


def render_text(data: dict, live: dict, views: list[str]) -> str:
    lines = [_strip_line(data, live)]
    if "memory" in views and "memory" in data:
        m = data["memory"]
        lines.append(f"memory: peak {format_size(live.get('peak', 0))} · timeline {_spark(m['points'])}")
        for r in m["rows"][-ROWS:]:
            lines.append(f"  In[{r['cell']}]  {format_size(r['before']):>11} → {format_size(r['after']):>11}  "
                         f"{format_delta(r['delta']):>12}  peak {format_size(r['peak'])}")
        if m.get("freed"):
            lines.append("  " + m["freed"].splitlines()[0])
    if "tensors" in views and "tensors" in data:
        t = data["tensors"]
        lines.append(f"device tensors: {len(t['rows'])} storages, {format_size(t['total'])} "
                     f"(memory_allocated {format_size(t['allocated'])})")
        for r in t["rows"][:ROWS]:
            shape = "×".join(map(str, r["shape"])) if r.get("shape") is not None else "?"
            lines.append(f"  {format_size(r['bytes']):>11}  {shape:<14} {r.get('dtype') or '?':<9} "
                         f"{r['held_by']:<20} {', '.join(r['names']) or '—'}")
    if "fallbacks" in views and "fallbacks" in data:
        h = data["header"]
        lines.append(f"CPU fallbacks, all cells (profile {h.get('profile') or 'none'}; {h['profile_hint']}):")
        rows = _fallback_rows(data)
        if not rows:
            lines.append("  none")
        for kind, title in _KIND_TITLES:
            mine = [r for r in rows if r["kind"] == kind]
            if mine:
                lines.append(f"  {title}:")
            for r in mine[:ROWS]:
                lines.append(f"    {r['op']:<34} {r['count']:>8,}×  {r['host_ms']:9.2f} ms  {r['reason']}")
                lines += [f"      {s['count']:>8,}×  {_site_text(s)}" for s in r["sites"][:ROWS]]
    if "compiles" in views and "compiles" in data:
        c = data["compiles"]
        tot = c["totals"]
        lines.append(f"compiles: {count(tot['compiles'], 'frame')}, {count(tot['graph_breaks'], 'graph break')}, "
                     f"{count(tot['recompiles'], 'recompile')}")
        for r in c["rows"][-ROWS:]:
            lines.append(f"  In[{r['cell']}] {count(r['graphs'], 'graph')}, compile {format_seconds(r['compile_s'])}, "
                         f"run {format_seconds(r['run_s'])}")
            lines += [f"    break at {_site_text(b['site'])}: {b['reason']}" for b in r["breaks"]]
            lines += [f"    recompile of {x['code']} ({_site_text(x['site'])}): {x['reason']}" for x in r["recompiles"]]
            lines += [f"    {x.splitlines()[0]}" for x in r["checks"] if x]
    return "\n".join(lines)


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th {_TD}>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td {_TD}>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table {_TABLE}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _svg(points: list, cells: list, width: int = 480, height: int = 60) -> str:
    if not points:
        return ""
    t_max = max(points[-1][0], 1e-9)
    top = max(b for _, b in points) or 1
    path = " ".join(f"{i and 'L' or 'M'}{t / t_max * width:.1f},{height - b / top * (height - 4):.1f}"
                    for i, (t, b) in enumerate(points))
    marks = "".join(f'<line x1="{c[1] / t_max * width:.1f}" x2="{c[1] / t_max * width:.1f}" y1="0" y2="{height}" '
                    'stroke="#bbb" stroke-dasharray="2,2"/>' for c in cells)
    return (f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
            f'aria-label="allocated bytes over the session">{marks}<path d="{path}" fill="none" stroke="#e67e22" '
            'stroke-width="1.5"/></svg>')


def render_html(data: dict, live: dict, views: list[str]) -> str:
    parts = [f"<div style='font-family:monospace;font-size:12px'>{escape(_strip_line(data, live))}</div>"]
    if "memory" in views and "memory" in data:
        m = data["memory"]
        parts.append(_svg(m["points"], m["cells"]))
        parts.append(_table(["cell", "before", "after", "delta", "peak"],
                            [[f"In[{r['cell']}]", format_size(r["before"]), format_size(r["after"]),
                              format_delta(r["delta"]), format_size(r["peak"])] for r in m["rows"][-ROWS:]]))
    if "tensors" in views and "tensors" in data:
        t = data["tensors"]
        parts.append(f"<b>device tensors</b> {format_size(t['total'])} "
                     f"(memory_allocated {format_size(t['allocated'])})")
        parts.append(_table(["bytes", "shape", "dtype", "grad", "held by", "names"],
                            [[format_size(r["bytes"]), escape(str(r.get("shape"))), escape(str(r.get("dtype"))),
                              "✓" if r.get("requires_grad") else "", escape(r["held_by"]),
                              escape(", ".join(r["names"]))] for r in t["rows"][:ROWS]]))
    if "fallbacks" in views and "fallbacks" in data:
        h = data["header"]
        parts.append(f"<b>CPU fallbacks, all cells</b> (profile {escape(str(h.get('profile')))}; "
                     f"{escape(h['profile_hint'])})")
        rows = _fallback_rows(data)
        for kind, title in _KIND_TITLES:
            mine = [r for r in rows if r["kind"] == kind][:ROWS]
            if mine:
                parts.append(f"<div><i>{title}</i>" + _table(
                    ["op", "calls", "host ms", "reason", "sites"],
                    [[f"<code>{escape(r['op'])}</code>", f"{r['count']:,}", f"{r['host_ms']:.2f}",
                      escape(r["reason"]),
                      "<br>".join(f"{s['count']:,}× {escape(_site_text(s))}" for s in r["sites"][:ROWS])]
                     for r in mine]) + "</div>")
    if "compiles" in views and "compiles" in data:
        c = data["compiles"]
        parts.append("<b>compiles</b>" + _table(
            ["cell", "graphs", "compile", "run", "breaks", "recompiles"],
            [[f"In[{r['cell']}]", str(r["graphs"]), format_seconds(r["compile_s"]), format_seconds(r["run_s"]),
              "<br>".join(escape(f"{_site_text(b['site'])}: {b['reason']}") for b in r["breaks"]),
              "<br>".join(escape(f"{x['code']}: {x['reason']}") for x in r["recompiles"])]
             for r in c["rows"][-ROWS:]]))
    return "<div class='neuron-lab-static'>" + "".join(parts) + "</div>"


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
        from neuron_lab.widgets import snapshot

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
