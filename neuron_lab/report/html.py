"""HTML rendering of a :class:`Report` for notebooks: one compact table per section, long lists folded.

Self-contained (inline styles, no scripts), so it survives nbconvert exports and untrusted notebooks.
"""

from __future__ import annotations

from html import escape

from neuron_lab.report.model import OpRow, Report
from neuron_lab.report.text import FOLD, summary_line
from neuron_lab.units import count, format_delta, format_seconds, format_size

_TABLE = 'style="border-collapse:collapse;font-size:12px;margin:2px 0"'
_CELL = 'style="padding:1px 8px;text-align:left;vertical-align:top"'


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th {_CELL}>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td {_CELL}>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table {_TABLE}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _folded(title: str, header: list[str], rows: list[list[str]], open_: bool = True) -> str:
    shown, rest = rows[:FOLD], rows[FOLD:]
    out = f"<div><b>{escape(title)}</b>{_table(header, shown)}"
    if rest:
        out += f"<details><summary>{len(rest)} more</summary>{_table(header, rest)}</details>"
    return out + "</div>"


def _site_cells(row: OpRow, full: bool) -> str:
    parts = []
    for sc in row.sites:
        s = f"<code>{escape(sc.site.label)}</code> {escape(sc.site.source)} ({sc.count:,}×)"
        if full and sc.stacks:
            s += "".join("<pre style='margin:0'>" + escape("\n".join(st)) + "</pre>" for st in sc.stacks)
        parts.append(s)
    if row.unattributed:
        parts.append(f"{row.unattributed:,} calls without a user line")
    return "<br>".join(parts)


def _op_rows(rows: list[OpRow], full: bool) -> list[list[str]]:
    return [[f"<code>{escape(r.op)}</code>", f"{r.count:,}", escape(format_seconds(r.host_ns / 1e9)),
             escape(", ".join(f"{list(s)} {d}" for s, d in zip(r.shapes, r.dtypes))), escape(r.reason),
             _site_cells(r, full)] for r in rows]


def render_html(r: Report, detail: str | None = None) -> str:
    detail = detail or r.detail
    head = f"<div style='font-family:monospace;font-size:12px'>{escape(summary_line(r))}</div>"
    if detail == "summary":
        return head
    full = detail == "full"
    m = r.memory
    parts = [head, _table(["memory before", "after", "Δ", "peak", "capacity", "host RSS Δ", "host→device",
                           "device→host"],
                          [[escape(x) for x in (format_size(m.before), format_size(m.after), format_delta(m.delta),
                                                format_size(m.peak), format_size(m.capacity),
                                                format_delta(m.host_rss_delta), format_size(r.h2d_bytes),
                                                format_size(r.d2h_bytes))]])]
    header = ["op", "calls", "host time", "first shapes", "why", "called from"]
    if r.fallbacks:
        parts.append(_folded(f"CPU fallbacks: {r.fallback_calls:,} calls", header, _op_rows(r.fallbacks, full)))
    if r.downcasts:
        parts.append(_folded("64-bit downcasts", header, _op_rows(r.downcasts, full)))
    c = r.compiles
    if c:
        timing = f"{format_seconds(c.compile_s)} compiling, {format_seconds(r.run_s)} running"
        what = f"{count(c.frames, 'frame compile')}, {count(c.graphs, 'graph')}"
        parts.append(f"<div><b>compile</b>: {what}, {escape(timing)}</div>")
        rows = [["graph break", escape(b.site.label) if b.site else "?", escape(b.site.source) if b.site else "",
                 escape(b.reason)] for b in c.breaks]
        rows += [["recompile", escape(x.site.label) if x.site else "?", escape(x.code), escape(x.reason)]
                 for x in c.recompiles]
        rows += [["failure", "", "", escape(f)] for f in c.failures]
        if rows:
            parts.append(_folded("", ["event", "where", "code", "why"], rows))
    parts += [c.html() if full else f"<div>check: {escape(c.summary_line())}</div>" for c in r.checks]
    if r.error:
        parts.append(f"<div>raised: <code>{escape(r.error)}</code></div>")
    return "<div class='neuron-lab-report'>" + "".join(parts) + "</div>"
