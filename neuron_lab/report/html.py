"""HTML layout of the report model for notebooks: the renderer-neutral rows (:mod:`~neuron_lab.report.rows` for a
cell's report, ``profiled_rows``, ``checks_rows``, ``ranks_rows``) that the text lays out too, one compact table per
section, long lists folded.

Self-contained (inline styles), so it survives nbconvert exports and untrusted notebooks. The one drawing, the
profile's timeline (:mod:`~neuron_lab.report.timeline_html`), is an SVG whose script only zooms what it shows.
"""

from __future__ import annotations

import functools
import re
from html import escape

from neuron_lab.kinds import Kind
from neuron_lab.report import profiled_rows as prof
from neuron_lab.report.checks import Agreement, ParityResult
from neuron_lab.report.checks_rows import (
    agreeing_text,
    agreement_notes,
    as_result,
    check_summary_line,
    compare_facts,
    divergence_lines,
    item_table,
    ordered_items,
    parity_head,
    timing_table,
    verdict,
)
from neuron_lab.report.model import Check, GraphBreak, OpRow, OutOfMemory, Profiled, Recompile, Report
from neuron_lab.report.profiled_rows import PERFETTO, profiled_head, profiled_tables, timeline_head, unattributed_text
from neuron_lab.report.ranks import RanksReport
from neuron_lab.report.ranks_rows import (
    HANG_HEAD,
    rank_table,
    ranks_profile,
    ranks_profile_heads,
    ranks_summary_line,
)
from neuron_lab.report.rows import (
    FOLD,
    Table,
    compile_counts,
    compile_timing,
    handled_oom_lines,
    held_table,
    host_growth,
    host_timed,
    imported_line,
    memory_table,
    one_line,
    oom_freed,
    oom_head,
    predicted,
    reasons,
    section_refs,
    shape_text,
    shown_sections,
    summary_line,
)
from neuron_lab.report.sites import called_at_html
from neuron_lab.report.timeline_html import timeline_html
from neuron_lab.units import count, format_seconds, format_size

_CODE = re.compile(r"`([^`]+)`")
_TABLE = 'style="border-collapse:collapse;font-size:12px;margin:2px 0"'
_CELL = 'style="padding:1px 8px;text-align:left;vertical-align:top"'


_TD = f"<td {_CELL}>"
_NEXT_TD = f"</td>{_TD}"


def table(header: list[str], rows: list[list[str]]) -> str:
    """A compact inline-styled table; ``rows`` are HTML already, ``header`` is text."""
    body = "".join([f"<tr>{_TD}{_NEXT_TD.join(row)}</td></tr>" if row else "<tr></tr>" for row in rows])
    return f"{_head(tuple(header))}{body}</tbody></table>"


@functools.lru_cache(maxsize=256)
def _head(header: tuple[str, ...]) -> str:
    """A table's opening up to its body, made once per header (a report's tables have a few fixed ones)."""
    head = "".join(f"<th {_CELL}>{escape(h)}</th>" for h in header)
    return f"<table {_TABLE}><thead><tr>{head}</tr></thead><tbody>"


@functools.lru_cache(maxsize=1024)
def sentence(text: str) -> str:
    """A sentence of the renderer-neutral rows as HTML: escaped, its `code` spans (what the text shows between
    backticks) as <code>. Every sentence an HTML view shows goes through here; made once per text (a reason, a
    kind's note: every cell of a loop repeats them)."""
    return _CODE.sub(r"<code>\1</code>", escape(text))


def escaped(rows: list[list[str]]) -> list[list[str]]:
    """Text cells (the renderer-neutral rows) as HTML cells."""
    return [[escape(c) for c in row] for row in rows]


def divs(lines: list[str]) -> str:
    """Sentences of text, a <div> each."""
    return "".join([f"<div>{sentence(x)}</div>" for x in lines])


def folded(title: str, header: list[str], rows: list[list[str]]) -> str:
    """A titled table showing its first :data:`FOLD` rows; the rest behind a <details>."""
    shown, rest = rows[:FOLD], rows[FOLD:]
    more = f"<details><summary>{len(rest)} more</summary>{table(header, rest)}</details>" if rest else ""
    return f"<div><b>{escape(title)}</b>{table(header, shown)}{more}</div>"  # one copy of the tables


def _site_cells(row: OpRow, full: bool) -> str:
    if len(row.sites) == 1 and not (full or row.unattributed):  # most rows: one line
        sc = row.sites[0]
        n = sc.count  # below 1,000 nothing to group: the cheaper format
        return f"{called_at_html(sc.site, sc.via)} ({n if 0 <= n < 1000 else f'{n:,}'}×)"
    parts = []
    for sc in row.sites:
        s = f"{called_at_html(sc.site, sc.via)} ({sc.count:,}×)"
        if full and sc.stacks:
            s += "".join("<pre style='margin:0'>" + escape("\n".join(st)) + "</pre>" for st in sc.stacks)
        parts.append(s)
    if row.unattributed:
        parts.append(f"{count(row.unattributed, 'call')} without a user line")
    return "<br>".join(parts)


_repeated = functools.lru_cache(maxsize=1024)(escape)  # texts every cell of a loop repeats: op names, shapes


def _op_rows(rows: list[OpRow], full: bool, timed: bool, refs: dict[str, int]) -> list[list[str]]:
    out = []
    for r in rows:
        why = f"[{refs[r.reason]}]" if r.reason in refs else sentence(r.why)
        n = r.count
        cells = [f"<code>{_repeated(r.op)}</code>", f"{n}" if 0 <= n < 1000 else f"{n:,}",
                 _repeated(shape_text(r, full)), why if r.rewrite is None else why + _rewrite(r), _site_cells(r, full)]
        if timed:
            cells.insert(2, format_seconds(r.host_ns / 1e9))  # a duration's text needs no escaping
        out.append(cells)
    return out


def _rewrite(r: OpRow) -> str:
    """The fallback's rewrite in native ops, folded: the hint, then the code to copy and its source."""
    w = r.rewrite
    if w is None:
        return ""
    return (f"<details><summary>rewrite: {sentence(w.hint)}</summary><pre>{escape(w.code)}</pre>"
            f"<small>source: {sentence(w.source)}</small></details>")


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
    for n, why, source in reasons(refs):
        note = f"<br><small>source: {sentence(source)}</small>" if source else ""
        items.append(f"<div>[{n}] {sentence(why)}{note}</div>")
    return f"<div><b>why</b>{''.join(items)}</div>"


def op_sections_html(sections: list[tuple[Kind, list[OpRow]]], full: bool = False) -> str:
    """Sections of op rows as every HTML view shows them (the facts of :func:`~neuron_lab.report.text.op_sections`);
    rows past the fold are in the page, so their reasons are numbered too."""
    refs = section_refs(sections, full, None)
    parts = []
    for kind, rows in sections:
        if kind.one_line and not full:
            why = f"<br><small>{escape(kind.why)}</small>" if kind.why else ""
            parts.append(f"<div>{sentence(one_line(kind, rows))}{why}</div>")
            continue
        title = f"{kind.title}: {count(sum(x.count for x in rows), 'call')}" if kind.off_device else kind.heading
        parts.append(op_table(title, rows, full, refs, kind.timed_as))
        if kind.why:
            parts.append(f"<div><small>{escape(kind.why)}</small></div>")
    parts.append(reasons_html(refs))
    return "".join(parts)


def oom_html(r: Report) -> str:
    """What held the device when the window ran out of its memory (the same facts as the text's lines)."""
    return "" if r.oom is None else oom_block(r.oom)


def oom_block(o: OutOfMemory) -> str:
    """The out-of-memory answer as HTML: the text's facts, the holders as a table."""
    held = held_table(o)
    rows = escaped(held.rows)
    if o.more:
        rows.append([escape(format_size(o.more)), "in smaller storages", "", "", ""])
    return f"<div><b>{escape(oom_head(o))}</b>{table(held.header, rows)}{divs(oom_freed(o))}</div>"


def _break_why(b: GraphBreak) -> str:
    """The plain reason, then the fix and dynamo's own words, smaller."""
    parts = [sentence(b.reason)]
    if b.hint:
        parts.append(f"<br><b>fix</b>: {sentence(b.hint)}")
    if b.note and b.note != b.reason:
        parts.append(f"<br><small>dynamo: <code>{escape(b.note)}</code></small>")
    return "".join(parts)


def compile_events_html(breaks: list[GraphBreak], recompiles: list[Recompile], failures: list[str]) -> str:
    """Graph breaks, recompiles and failed compiles in one folded table ("" when there are none)."""
    rows = [["graph break", called_at_html(b.site, b.via), "", _break_why(b)] for b in breaks]
    rows += [["recompile", escape(x.site.label) if x.site else "?", escape(x.code), escape(x.reason)]
             for x in recompiles]
    rows += [["failure", "", "", sentence(f)] for f in failures]
    return folded("", ["event", "where", "code", "why"], rows) if rows else ""


def render_html(r: Report, detail: str | None = None) -> str:
    detail = detail or r.detail
    head = f"<div style='font-family:monospace;font-size:12px'>{escape(summary_line(r))}</div>"
    if detail == "summary":
        return head
    full = detail == "full"
    parts = [head]
    c = r.compiles
    if c:  # what a compile cell is about comes first
        parts.append(f"<div><b>compile</b>: {compile_counts(c)}, {escape(compile_timing(r))}</div>")
        parts.append(compile_events_html(c.breaks, c.recompiles, c.failures))
    memory = memory_table(r)
    parts.append(table(memory.header, memory.rows))  # sizes and "after first device use": nothing to escape
    host = host_growth(r, full)
    if host:
        parts.append(divs([host]))
    parts.append(divs([x for x in [imported_line(c)] if x]))
    parts.append(op_sections_html(shown_sections(r, full), full))
    if r.coverage and predicted(r):
        parts.append(f"<div>predicted by the coverage <code>{escape(r.coverage)}</code></div>")
    if r.profiled is not None:
        parts.append(profiled_html(r.profiled, full))
    parts += [render_check_html(c) if full else f"<div>check: {sentence(check_summary_line(c))}</div>"
              for c in r.checks]
    if r.error:
        parts.append(f"<div>raised: <code>{escape(r.error)}</code></div>")
    parts.append(divs(handled_oom_lines(r)) + oom_html(r))
    return "".join(["<div class='neuron-lab-report'>", *parts, "</div>"])  # one copy of the parts


def profiled_html(p: Profiled, full: bool = False, head: bool = True) -> str:
    """The profile section (the facts of :func:`~neuron_lab.report.text.profiled_lines`): the op table and the time
    per line, each showing ``row_limit`` rows and the rest behind a <details>."""
    limit = None if full else p.row_limit

    def fold(title: str, t: Table) -> str:
        cells = escaped(t.rows)
        shown, rest = cells[:limit], cells[len(cells[:limit]):]
        out = f"<div><b>{escape(title)}</b>{table(t.header, shown)}"
        if rest:
            out += f"<details><summary>{len(rest)} more</summary>{table(t.header, rest)}</details>"
        return out + "</div>"

    parts = [f"<div><b>{escape(profiled_head(p))}</b></div>"] if head else []
    parts += [divs(prof.device_notes(p))] if prof.device_notes(p) else []
    parts += [fold(title, t) for title, _, t in profiled_tables(p)]
    if p.unattributed_ns:
        parts.append(divs([unattributed_text(p)]))
    if p.timeline.lanes or p.timeline.memory:
        parts.append(timeline_html(p.timeline, timeline_head(p.timeline)))
    if p.trace_path:
        parts.append(f"<div>trace: <code>{escape(p.trace_path)}</code> (open it in "
                     f"<a href='{PERFETTO}' target='_blank'>{PERFETTO}</a>)</div>")
    if p.artefacts_dir is not None:
        parts.append(divs(prof.artefact_lines(p)))
    return "<div class='neuron-lab-profile'>" + "".join(parts) + "</div>"


# -- checks: %%neuron parity / compare (neuron_lab.report.checks) ------------------------------------------------------
def agreement_html(a: Agreement, divergence: bool = True) -> str:
    """The items over tolerance in a table, the agreeing ones folded behind a <details> that counts them."""
    parts = [divs(divergence_lines(a))] if divergence else []
    failed, agreeing = ordered_items(a)
    if failed:
        t = item_table(a, failed)
        parts.append(table(t.header, escaped(t.rows)))
    if agreeing:
        t = item_table(a, agreeing)
        parts.append(f"<details><summary>{escape(agreeing_text(agreeing))}</summary>"
                     f"{table(t.header, escaped(t.rows))}</details>")
    return "".join(parts) + divs(agreement_notes(a))


def render_check_html(check: Check) -> str:
    """A parity or compare check in full."""
    result = as_result(check)
    if isinstance(result, ParityResult):
        body = divs(parity_head(result))
    else:
        t = timing_table(result)
        body = (f"<div><b>{sentence(check_summary_line(result))}</b></div>"
                f"{table(t.header, escaped(t.rows))}{divs(compare_facts(result))}"
                f"{compile_events_html(result.breaks, result.recompiles, result.failures)}"
                f"<div>numeric agreement, compiled against eager: {escape(verdict(result.agreement))}</div>")
    return (f"<div class='neuron-lab-check' style='font-family:monospace;font-size:12px'>{body}"
            f"{agreement_html(result.agreement, divergence=not isinstance(result, ParityResult))}</div>")


# -- several ranks: %%neuron ranks, neuron-lab run --nproc (neuron_lab.report.ranks) ---------------------------------
def render_ranks_html(rr: RanksReport) -> str:
    """The facts of :func:`~neuron_lab.report.text.render_ranks_text`: the rank table, all ranks' rows, and when
    profiled each rank's profile head, one rank's op table and the timeline of all ranks."""
    ranks = rank_table(rr)
    head = folded(ranks_summary_line(rr), ranks.header, escaped(ranks.rows))
    hang = rr.hang()
    if hang:
        head += (f"<div class=\"neuron-lab-hang\"><b>{escape(HANG_HEAD)}</b>"
                 f"{''.join(f'<div>{escape(line)}</div>' for line in hang)}</div>")
    merged = rr.merged()
    rows = (f"<div>summed over {count(len(rr.reports), 'rank')}:</div>{op_sections_html(merged.sections())}"
            if merged.ops_not_native else "")
    shown = ranks_profile(rr)
    if shown is not None:
        first, *heads = ranks_profile_heads(rr)
        rows += (f"<div><b>{escape(first)}</b>{''.join(f'<div>{escape(h.strip())}</div>' for h in heads)}</div>"
                 f"{profiled_html(shown, head=False)}")
    return f"<div class=\"neuron-lab-ranks\">{head}{rows}</div>"
