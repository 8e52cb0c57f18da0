"""HTML rendering of a :class:`Report` for notebooks: one compact table per section, long lists folded.

Self-contained (inline styles), so it survives nbconvert exports and untrusted notebooks. The one drawing, the
profile's timeline (:mod:`~neuron_lab.report.timeline_html`), is an SVG whose script only zooms what it shows.
"""

from __future__ import annotations

from html import escape
from typing import Any

from neuron_lab.kinds import Kind
from neuron_lab.report.model import GraphBreak, OpRow, Profiled, Recompile, Report
from neuron_lab.report.text import (
    FOLD,
    LINE_HEADER,
    PERFETTO,
    PROFILED_HEADER,
    RANK_HEADER,
    agreeing_text,
    agreement_notes,
    check_summary_line,
    compare_facts,
    divergence_lines,
    host_timed,
    item_header,
    item_rows,
    line_rows,
    one_line,
    oom_lines,
    ordered_items,
    parity_head,
    profiled_head,
    profiled_rows,
    rank_rows,
    ranks_profile,
    ranks_profile_heads,
    ranks_summary_line,
    section_refs,
    shape_text,
    summary_line,
    timeline_head,
    timing_rows,
    verdict,
)
from neuron_lab.report.timeline_html import timeline_html
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


def _op_rows(rows: list[OpRow], full: bool, timed: bool, refs: dict[str, int]) -> list[list[str]]:
    return [[f"<code>{escape(r.op)}</code>", f"{r.count:,}",
             *([escape(format_seconds(r.host_ns / 1e9))] if timed else []),
             escape(shape_text(r)),
             f"[{refs[r.reason]}]" if r.reason in refs else escape(r.why), _site_cells(r, full)] for r in rows]


def op_table(title: str, rows: list[OpRow], full: bool = False, refs: dict[str, int] | None = None,
             timed_as: str = "on the host") -> str:
    """A titled, folded table of ops that did not run natively, with their call sites (stacks when ``full``); the why
    column holds the number of the reason in ``refs`` (the reason itself when ``refs`` is None)."""
    timed = host_timed(rows)
    time = "host time" if timed_as == "on the host" else "time"
    header = ["op", "calls", *([time] if timed else []), "first shapes", "why", "called from"]
    return folded(title, header, _op_rows(rows, full, timed, refs or {}))


def reasons_html(refs: dict[str, int]) -> str:
    """The numbered reasons a report's rows refer to, each once, its source as a note."""
    if not refs:
        return ""
    items = []
    for reason, n in refs.items():
        row = OpRow("", "", reason)
        note = f"<br><small>source: {escape(row.source)}</small>" if row.source else ""
        items.append(f"<div>[{n}] {escape(row.why)}{note}</div>")
    return f"<div><b>why</b>{''.join(items)}</div>"


def op_sections_html(sections: list[tuple[Kind, list[OpRow]]], full: bool = False) -> str:
    """Sections of op rows as every HTML view shows them (the facts of :func:`~neuron_lab.report.text.op_sections`);
    rows past the fold are in the page, so their reasons are numbered too."""
    refs = section_refs(sections, full, None)
    parts = []
    for kind, rows in sections:
        if kind.one_line and not full:
            parts.append(f"<div>{escape(one_line(kind, rows))}</div>")
            continue
        title = f"{kind.title}: {sum(x.count for x in rows):,} calls" if kind.off_device else kind.title
        parts.append(op_table(title, rows, full, refs, kind.timed_as))
    return "".join(parts) + reasons_html(refs)


def oom_html(r: Report) -> str:
    """What held the device when the window ran out of its memory (the same facts as the text's lines)."""
    if r.oom is None:
        return ""
    lines = oom_lines(r)
    rows = [[escape(format_size(t.bytes)), escape(", ".join(t.names) or "-"),
             escape(f"{list(t.shape) if t.shape is not None else '?'} {t.dtype or ''}".rstrip()),
             f"{t.storages:,}", escape(t.held_by)] for t in r.oom.tensors]
    if r.oom.more:
        rows.append([escape(format_size(r.oom.more)), "in smaller storages", "", "", ""])
    tail = "".join(f"<div>{escape(x)}</div>" for x in lines[1 + len(rows):])
    return (f"<div><b>{escape(lines[0])}</b>{table(['bytes', 'names', 'shape', 'storages', 'held by'], rows)}"
            f"{tail}</div>")


def _break_why(b: GraphBreak) -> str:
    """The plain reason, then the fix and dynamo's own words, smaller."""
    parts = [escape(b.reason)]
    if b.hint:
        parts.append(f"<br><b>fix</b>: {escape(b.hint)}")
    if b.note and b.note != b.reason:
        parts.append(f"<br><small>dynamo: <code>{escape(b.note)}</code></small>")
    return "".join(parts)


def compile_events_html(breaks: list[GraphBreak], recompiles: list[Recompile], failures: list[str]) -> str:
    """Graph breaks, recompiles and failed compiles in one folded table ("" when there are none)."""
    rows = [["graph break", escape(b.site.label) if b.site else "?", escape(b.site.source) if b.site else "",
             _break_why(b)] for b in breaks]
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
    parts.append(op_sections_html(r.sections(), full))
    if r.coverage and r.fallbacks:
        parts.append(f"<div>predicted by the coverage <code>{escape(r.coverage)}</code></div>")
    c = r.compiles
    if c:
        timing = f"{format_seconds(c.compile_s)} compiling, {format_seconds(r.run_s)} running"
        what = f"{count(c.frames, 'frame compile')}, {count(c.graphs, 'graph')}"
        parts.append(f"<div><b>compile</b>: {what}, {escape(timing)}</div>")
        parts.append(compile_events_html(c.breaks, c.recompiles, c.failures))
    if r.profiled is not None:
        parts.append(profiled_html(r.profiled, full))
    parts += [render_check_html(c) if full else f"<div>check: {escape(check_summary_line(c))}</div>"
              for c in r.checks]
    if r.error:
        parts.append(f"<div>raised: <code>{escape(r.error)}</code></div>")
    parts.append(oom_html(r))
    return "<div class='neuron-lab-report'>" + "".join(parts) + "</div>"


def profiled_html(p: Profiled, full: bool = False, head: bool = True) -> str:
    """The profile section (the facts of :func:`~neuron_lab.report.text.profiled_lines`): the op table and the time
    per line, each showing ``row_limit`` rows and the rest behind a <details>."""
    limit = None if full else p.row_limit

    def fold(title: str, header: list[str], rows: list[list[str]]) -> str:
        cells = [[escape(c) for c in row] for row in rows]
        shown, rest = cells[:limit], cells[len(cells[:limit]):]
        out = f"<div><b>{escape(title)}</b>{table(header, shown)}"
        if rest:
            out += f"<details><summary>{len(rest)} more</summary>{table(header, rest)}</details>"
        return out + "</div>"

    parts = [f"<div><b>{escape(profiled_head(p))}</b></div>"] if head else []
    if p.rows:
        parts.append(fold("ops by device + host time", PROFILED_HEADER, profiled_rows(p)))
    if p.lines:
        parts.append(fold("time per line", LINE_HEADER, line_rows(p)))
    if p.unattributed_ns:
        parts.append(f"<div>{escape(format_seconds(p.unattributed_ns / 1e9))} in calls without a user line</div>")
    if p.timeline.lanes or p.timeline.memory:
        parts.append(timeline_html(p.timeline, timeline_head(p.timeline)))
    if p.trace_path:
        parts.append(f"<div>trace: <code>{escape(p.trace_path)}</code> (open it in "
                     f"<a href='{PERFETTO}' target='_blank'>{PERFETTO}</a>)</div>")
    return "<div class='neuron-lab-profile'>" + "".join(parts) + "</div>"


# -- checks: %%neuron parity / compare (neuron_lab.report.checks, read by their fields as in text.py) --------------
def _divs(lines: list[str]) -> str:
    return "".join(f"<div>{escape(x)}</div>" for x in lines)


def _agreement_html(a: Any, divergence: bool = True) -> str:
    """The items over tolerance in a table, the agreeing ones folded behind a <details> that counts them."""
    parts = [_divs(divergence_lines(a))] if divergence else []
    failed, agreeing = ordered_items(a)
    if failed:
        parts.append(table(item_header(a), [[escape(c) for c in r] for r in item_rows(a, failed)]))
    if agreeing:
        rows = [[escape(c) for c in r] for r in item_rows(a, agreeing)]
        parts.append(f"<details><summary>{escape(agreeing_text(agreeing))}</summary>"
                     f"{table(item_header(a), rows)}</details>")
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
            f"{_agreement_html(result.agreement, divergence=result.kind != 'parity')}</div>")


def render_ranks_html(rr: Any) -> str:
    """The facts of :func:`~neuron_lab.report.text.render_ranks_text`: the rank table, all ranks' rows, and when
    profiled each rank's profile head, one rank's op table and the timeline of all ranks."""
    table = folded(ranks_summary_line(rr), RANK_HEADER, [[escape(c) for c in row] for row in rank_rows(rr)])
    merged = rr.merged()
    rows = (f"<div>summed over {count(len(rr.reports), 'rank')}:</div>{op_sections_html(merged.sections())}"
            if merged.ops_not_native else "")
    shown = ranks_profile(rr)
    if shown is not None:
        first, *heads = ranks_profile_heads(rr)
        rows += (f"<div><b>{escape(first)}</b>{''.join(f'<div>{escape(h.strip())}</div>' for h in heads)}</div>"
                 f"{profiled_html(shown, head=False)}")
    return f"<div class=\"neuron-lab-ranks\">{table}{rows}</div>"
