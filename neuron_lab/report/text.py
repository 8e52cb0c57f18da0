"""Plain-text layout of the report model: terminals, CI logs, ``print(report)``.

The facts and their words come from the renderer-neutral rows (:mod:`~neuron_lab.report.rows` for a cell's report,
``profiled_rows``, ``checks_rows``, ``ranks_rows``), which the HTML lays out too; this module only lays them out as
lines and aligned columns.
"""

from __future__ import annotations

from neuron_lab import kinds
from neuron_lab.report import profiled_rows as prof
from neuron_lab.report.checks import Agreement, ParityResult
from neuron_lab.report.checks_rows import (
    CHECK_FOLD,
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
from neuron_lab.report.model import Check, GraphBreak, OpRow, OutOfMemory, Profiled, ProfiledTimeline, Recompile, Report
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
    off_device,
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
from neuron_lab.report.sites import SITES_SHOWN, called_at
from neuron_lab.units import count, format_seconds, format_size


def columns(table: Table, indent: str = "  ") -> list[str]:
    """The header and the rows, each column as wide as its widest cell."""
    rows = [table.header, *table.rows]
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    return [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


# -- a cell's report ---------------------------------------------------------------------------------------------------
def reason_lines(refs: dict[str, int]) -> list[str]:
    """The numbered reasons, each with its source as a note."""
    lines = ["why:"] if refs else []
    for n, why, source in reasons(refs):
        lines.append(f"  [{n}] {why}")
        if source:
            lines.append(f"      source: {source}")
    return lines


def op_lines(title: str, rows: list[OpRow], full: bool = False, refs: dict[str, int] | None = None,
             timed_as: str = "on the host") -> list[str]:
    """A titled list of ops that did not run natively, each with its call sites (stacks when ``full``) and the number
    of its reason in ``refs`` (the reason itself when ``refs`` is None)."""
    total = sum([x.count for x in rows])
    timed = host_timed(rows)
    host = f", {format_seconds(sum([x.host_ns for x in rows]) / 1e9)} {timed_as}" if timed else ""
    lines = [f"{title} ({count(len(rows), 'op')}, {count(total, 'call')}{host}):"]
    shown = rows if full else rows[:FOLD]
    width = max(32, *(len(r.op) for r in shown)) if shown else 32  # a long name widens the column, not one row
    for row in shown:
        time = f"  {format_seconds(row.host_ns / 1e9):>9}" if timed else ""
        why = f"  why [{refs[row.reason]}]" if refs is not None and row.reason in refs else ""
        n = row.count  # below 1,000 nothing to group: the cheaper format (every row of every report)
        calls = f"{n}".rjust(7) if 0 <= n < 1000 else f"{n:>7,}"
        lines.append(f"  {row.op:<{width}} {calls}×{time}  {shape_text(row, full)}{why}".rstrip())
        if refs is None and row.reason:
            lines.append(f"      why: {row.why}")
        if row.rewrite is not None:
            lines += rewrite_lines(row, full)
        sites = row.sites if full else row.sites[:SITES_SHOWN]
        for sc in sites:
            n = sc.count
            lines.append(f"      at {called_at(sc.site, sc.via)}  ({n if 0 <= n < 1000 else f'{n:,}'}×)")
            if full:
                for stack in sc.stacks:
                    lines.append("        stack:")
                    lines.extend(f"          {frame}" for frame in stack)
        if len(row.sites) > len(sites):
            lines.append(f"      … {count(len(row.sites) - len(sites), 'more site')}")
        if row.unattributed:
            lines.append(f"      {count(row.unattributed, 'call')} without a user line")
    if len(rows) > len(shown):
        lines.append(f"  … {count(len(rows) - len(shown), 'more op')} (`%neuron report --full`)")
    return lines


def rewrite_lines(row: OpRow, full: bool) -> list[str]:
    """The fallback's rewrite in native ops: a hint, or (``full``) the code to copy and its source."""
    w = row.rewrite
    if w is None:
        return []
    if not full:
        return [f"      rewrite: {w.hint} (`%neuron report --full` shows the code)"]
    return [f"      rewrite: {w.hint}", *(f"        {x}".rstrip() for x in w.code.splitlines()),
            f"        source: {w.source}"]


def op_sections(sections: list[tuple[kinds.Kind, list[OpRow]]], full: bool = False) -> list[str]:
    """Sections of op rows (:meth:`Report.sections`) as every text view shows them: a table each (one line for a kind
    that ``one_line`` folds, unless ``full``), then each reason once."""
    refs = section_refs(sections, full, None if full else FOLD)
    lines = []
    for kind, rows in sections:
        section = ([one_line(kind, rows)] if kind.one_line and not full
                   else op_lines(kind.heading, rows, full, refs, kind.timed_as))
        lines += section[:1] + ([f"  {kind.why}"] if kind.why and len(section) > 1 else []) + section[1:]
    return lines + reason_lines(refs)


def oom_lines(r: Report) -> list[str]:
    """What held the device when the window ran out of its memory, biggest first, and what was freed after."""
    return [] if r.oom is None else oom_text(r.oom)


def oom_text(o: OutOfMemory) -> list[str]:
    """The out-of-memory answer: asked, free, held, then the holders, biggest first, and what was freed after."""
    lines = [oom_head(o)]
    for t, (size, names, shape, _, held_by) in zip(o.tensors, held_table(o).rows):
        what = f"{t.storages} × " if t.storages > 1 else ""
        lines.append(f"  {size:>12}  {names}  ({what}{shape}; {held_by})")
    if o.more:
        lines.append(f"  {format_size(o.more):>12}  in smaller storages (`%neuron tensors` lists them all)")
    return lines + oom_freed(o)


def compile_event_lines(breaks: list[GraphBreak], recompiles: list[Recompile], failures: list[str],
                        limit: int | None = None) -> list[str]:
    """Graph breaks and recompiles (``limit`` of each at most), where and why, then the compiles that failed."""
    lines = []
    for b in breaks[:limit]:
        lines.append(f"  graph break at {called_at(b.site, b.via)}\n      why: {b.reason}")
        if b.hint:
            lines.append(f"      fix: {b.hint}")
        if b.note and b.note != b.reason:
            lines.append(f"      dynamo: {b.note}")
    for rc in recompiles[:limit]:
        where = f" ({rc.site.label})" if rc.site else ""
        lines.append(f"  recompile of {rc.code}{where}\n      guard: {rc.reason}")
    return lines + [f"  compile failed: {f}" for f in failures]


def render_text(r: Report, detail: str | None = None) -> str:
    detail = detail or r.detail
    head = summary_line(r)
    if detail == "summary":
        return head
    full = detail == "full"
    lines = [head]
    c = r.compiles
    if c:  # what a compile cell is about comes first
        lines.append(f"compile: {compile_counts(c)}, {compile_timing(r)}")
        lines += compile_event_lines(c.breaks, c.recompiles, c.failures, None if full else FOLD)
    before, after, delta, peak, capacity, h2d, d2h = memory_table(r).rows[0]
    lines.append(f"memory: {before} → {after} ({delta}), peak {peak} of {capacity}")
    host = host_growth(r, full)
    if host:
        lines.append(host)
    if r.h2d_bytes or r.d2h_bytes:
        lines.append(f"copies: host→device {h2d}, device→host {d2h}")
    lines += [x for x in [imported_line(c)] if x]
    lines += op_sections(shown_sections(r, full), full)
    if r.coverage and predicted(r):
        lines.append(f"predicted by the coverage {r.coverage} (`%neuron coverage NAME` switches)")
    if not r.callsites and off_device(r):
        lines.append("call sites are off (`%config NeuronLab.callsites = True` turns them on)")
    if r.profiled is not None:
        lines += profiled_lines(r.profiled, full)
    lines += [render_check_text(c) if full else f"check: {check_summary_line(c)}" for c in r.checks]
    if r.error:
        lines.append(f"raised: {r.error}")
    lines += handled_oom_lines(r) + oom_lines(r)
    return "\n".join(lines)


# -- %%neuron profile / neuron_lab.profile(): torch.profiler's view (report.profiled) --------------------------------
def timeline_lines(t: ProfiledTimeline) -> list[str]:
    """The timeline in words (the HTML draws it): each lane's events and busy time, each device's memory."""
    if not t.lanes and not t.memory:
        return []
    lines = [timeline_head(t)]
    for lane in t.lanes:
        events, busy = sum(s.events for s in lane.spans), sum(s.busy_ns for s in lane.spans)
        lines.append(f"  {lane.name}: {count(events, 'event')}, busy {format_seconds(busy / 1e9)}")
    for m in t.memory:
        lines.append(f"  {m.device} memory: {format_size(m.points[0][1])} at the start, peak {format_size(m.peak)}, "
                     f"{format_size(m.points[-1][1])} at the end")
    return lines


def trace_line(p: Profiled) -> list[str]:
    return [f"trace: {p.trace_path} (open it in {PERFETTO})"] if p.trace_path else []


def profiled_lines(p: Profiled, full: bool = False, head: bool = True) -> list[str]:
    """The profile section: its head (unless ``head`` is False: the ranks' report heads it), the op table and the
    time per line (``row_limit`` rows each unless ``full``), the calls no user line issued, and the exported trace."""
    limit = None if full else p.row_limit
    lines = ([profiled_head(p)] if head else []) + [f"  {n}" for n in prof.device_notes(p)]
    for title, noun, table in profiled_tables(p):
        shown = table.rows[:limit]
        lines += [f"{title}:", *columns(Table(table.header, shown))]
        if len(table.rows) > len(shown):
            lines.append(f"  … {count(len(table.rows) - len(shown), 'more ' + noun)} (`%neuron report --full`)")
    if p.unattributed_ns:
        lines.append(f"  {unattributed_text(p)}")
    return lines + timeline_lines(p.timeline) + trace_line(p) + prof.artefact_lines(p)


# -- checks: %%neuron parity / compare (neuron_lab.report.checks) ------------------------------------------------------
def agreement_lines(a: Agreement, divergence: bool = True) -> list[str]:
    """The items: all of them when they are few, else those over tolerance and a count of the agreeing rest."""
    lines = divergence_lines(a) if divergence else []
    failed, agreeing = ordered_items(a)
    if len(a.items) <= CHECK_FOLD:
        lines += columns(item_table(a, failed + agreeing)) if a.items else []
    else:
        lines += columns(item_table(a, failed)) if failed else []
        lines += [f"  {'+ ' if failed else ''}{agreeing_text(agreeing)}"] if agreeing else []
    return lines + agreement_notes(a)


def render_check_text(check: Check) -> str:
    """A parity or compare check in full."""
    result = as_result(check)
    a = result.agreement
    if isinstance(result, ParityResult):
        return "\n".join(parity_head(result) + agreement_lines(a, divergence=False))
    return "\n".join([f"neuron_lab {check_summary_line(result)}", *columns(timing_table(result)),
                      *compare_facts(result),
                      *compile_event_lines(result.breaks, result.recompiles, result.failures),
                      f"numeric agreement, compiled against eager: {verdict(a)}", *agreement_lines(a)])


# -- several ranks: %%neuron ranks, neuron-lab run --nproc (neuron_lab.report.ranks) ---------------------------------
def render_ranks_text(rr: RanksReport) -> str:
    """The summary line, every rank's line (its error in one line), then the rows of all ranks, summed over them;
    when profiled, each rank's profile in one line, one rank's op table and the timeline of all ranks."""
    lines = [ranks_summary_line(rr), *columns(rank_table(rr), indent="")]
    hang = rr.hang()
    if hang:
        lines += [f"{HANG_HEAD}:", *("  " + line for line in hang)]
    merged = rr.merged()
    if merged.ops_not_native:
        lines.append(f"summed over {count(len(rr.reports), 'rank')}:")
        lines += ["  " + line for line in op_sections(merged.sections())]
    shown = ranks_profile(rr)
    if shown is not None:
        lines += ranks_profile_heads(rr) + profiled_lines(shown, head=False)
    return "\n".join(lines)
