"""HTML rendering of a :class:`Report` for notebooks: one compact table per section, long lists folded.

Self-contained (inline styles, no scripts), so it survives nbconvert exports and untrusted notebooks.
"""

from __future__ import annotations

from html import escape
from typing import Any

from neuron_lab.report.model import GraphBreak, OpRow, Recompile, Report
from neuron_lab.report.text import (
    FOLD,
    agreement_notes,
    check_summary_line,
    compare_facts,
    divergence_lines,
    item_header,
    item_rows,
    parity_head,
    summary_line,
    timing_rows,
    verdict,
)
from neuron_lab.units import count, format_delta, format_seconds, format_size

_TABLE = 'style="border-collapse:collapse;font-size:12px;margin:2px 0"'
_CELL = 'style="padding:1px 8px;text-align:left;vertical-align:top"'


def table(header: list[str], rows: list[list[str]]) -> str:
    """A compact inline-styled table; ``rows`` are HTML already, ``header`` is text."""
    head = "".join(f"<th {_CELL}>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td {_CELL}>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table {_TABLE}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def folded(title: str, header: list[str], rows: list[list[str]]) -> str:
    """A titled table showing its first :data:`FOLD` rows; the rest behind a <details>."""
    shown, rest = rows[:FOLD], rows[FOLD:]
    out = f"<div><b>{escape(title)}</b>{table(header, shown)}"
    if rest:
        out += f"<details><summary>{len(rest)} more</summary>{table(header, rest)}</details>"
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


def op_table(title: str, rows: list[OpRow], full: bool = False) -> str:
    """A titled, folded table of ops that did not run natively, with their call sites (stacks when ``full``)."""
    return folded(title, ["op", "calls", "host time", "first shapes", "why", "called from"], _op_rows(rows, full))


def compile_events_html(breaks: list[GraphBreak], recompiles: list[Recompile], failures: list[str]) -> str:
    """Graph breaks, recompiles and failed compiles in one folded table ("" when there are none)."""
    rows = [["graph break", escape(b.site.label) if b.site else "?", escape(b.site.source) if b.site else "",
             escape(b.reason)] for b in breaks]
    rows += [["recompile", escape(x.site.label) if x.site else "?", escape(x.code), escape(x.reason)]
             for x in recompiles]
    rows += [["failure", "", "", escape(f)] for f in failures]
    return folded("", ["event", "where", "code", "why"], rows) if rows else ""


def render_html(r: Report, detail: str | None = None) -> str:
    detail = detail or r.detail
    head = f"<div style='font-family:monospace;font-size:12px'>{escape(summary_line(r))}</div>"
    if detail == "summary":
        return head
    full = detail == "full"
    m = r.memory
    parts = [head, table(["memory before", "after", "Δ", "peak", "capacity", "host RSS Δ", "host→device",
                           "device→host"],
                          [[escape(x) for x in (format_size(m.before), format_size(m.after), format_delta(m.delta),
                                                format_size(m.peak), format_size(m.capacity),
                                                format_delta(m.host_rss_delta), format_size(r.h2d_bytes),
                                                format_size(r.d2h_bytes))]])]
    for kind, rows in r.sections():
        title = f"{kind.title}: {sum(x.count for x in rows):,} calls" if kind.off_device else kind.title
        parts.append(op_table(title, rows, full))
    if r.profile and r.fallbacks:
        parts.append(f"<div>predicted by the coverage profile <code>{escape(r.profile)}</code></div>")
    c = r.compiles
    if c:
        timing = f"{format_seconds(c.compile_s)} compiling, {format_seconds(r.run_s)} running"
        what = f"{count(c.frames, 'frame compile')}, {count(c.graphs, 'graph')}"
        parts.append(f"<div><b>compile</b>: {what}, {escape(timing)}</div>")
        parts.append(compile_events_html(c.breaks, c.recompiles, c.failures))
    parts += [render_check_html(c) if full else f"<div>check: {escape(check_summary_line(c))}</div>"
              for c in r.checks]
    if r.error:
        parts.append(f"<div>raised: <code>{escape(r.error)}</code></div>")
    return "<div class='neuron-lab-report'>" + "".join(parts) + "</div>"


# -- checks: %%neuron parity / compare (neuron_lab.report.checks, read by their fields as in text.py) --------------
def _divs(lines: list[str]) -> str:
    return "".join(f"<div>{escape(x)}</div>" for x in lines)


def _agreement_html(a: Any) -> str:
    parts = [_divs(divergence_lines(a))]
    if a.items:
        rows = sorted(item_rows(a), key=lambda r: r[1] == "ok")  # failures first, then the folded rest
        parts.append(folded("", item_header(a), [[escape(c) for c in r] for r in rows]))
    return "".join(parts) + _divs(agreement_notes(a))


def render_check_html(result: Any) -> str:
    """A :class:`~neuron_lab.report.checks.ParityResult` or ``CompareResult`` in full."""
    if result.kind == "parity":
        body = _divs(parity_head(result))
    else:
        rows = timing_rows(result)
        body = (f"<div><b>{escape(check_summary_line(result))}</b></div>"
                f"{table(rows[0], [[escape(c) for c in r] for r in rows[1:]])}{_divs(compare_facts(result))}"
                f"{compile_events_html(result.breaks, result.recompiles, result.failures)}"
                f"<div>numeric agreement, compiled against eager: {escape(verdict(result.agreement))}</div>")
    return (f"<div class='neuron-lab-check' style='font-family:monospace;font-size:12px'>{body}"
            f"{_agreement_html(result.agreement)}</div>")
