"""Plain-text rendering of a :class:`Report`: terminals, CI logs, ``print(report)``."""

from __future__ import annotations

from neuron_lab.report.model import OpRow, Report
from neuron_lab.units import count, format_delta, format_seconds, format_size

FOLD = 8  # rows shown per list in "table" detail; "full" shows all


def _shape(row: OpRow) -> str:
    if not row.shapes:
        return ""
    return ", ".join(f"{list(s)} {d}" for s, d in zip(row.shapes, row.dtypes))


def summary_line(r: Report) -> str:
    parts = [r.title, r.device, r.mode, format_seconds(r.wall_s)]
    if r.compiles.compile_s:
        parts[-1] += f" (compile {format_seconds(r.compiles.compile_s)}, run {format_seconds(r.run_s)})"
    parts.append(count(r.ops, "op"))
    fb = r.fallbacks
    parts.append(f"{count(r.fallback_calls, 'CPU fallback call')} ({count(len(fb), 'op')})" if fb
                 else "no CPU fallbacks")
    if r.downcasts:
        parts.append(count(sum(x.count for x in r.downcasts), "64-bit downcast"))
    m = r.memory
    parts.append(f"mem {format_size(m.after)} ({format_delta(m.delta)}, peak {format_size(m.peak)})")
    if r.compiles:
        c = r.compiles
        parts.append(f"{count(c.graphs, 'graph')}, {count(len(c.breaks), 'break')}, "
                     f"{count(len(c.recompiles), 'recompile')}")
    if r.error:
        parts.append(f"raised {r.error.split(':')[0]}")
    return "neuron_lab " + " · ".join(parts)


def _rows(lines: list[str], title: str, rows: list[OpRow], full: bool) -> None:
    total = sum(x.count for x in rows)
    host = sum(x.host_ns for x in rows) / 1e9
    lines.append(f"{title} ({count(len(rows), 'op')}, {count(total, 'call')}, {format_seconds(host)} on the host):")
    shown = rows if full else rows[:FOLD]
    for row in shown:
        lines.append(f"  {row.op:<32} {row.count:>7,}×  {format_seconds(row.host_ns / 1e9):>9}  {_shape(row)}")
        lines.append(f"      why: {row.reason}")
        sites = row.sites if full else row.sites[:3]
        for sc in sites:
            lines.append(f"      at {sc.site.label}: {sc.site.source}  ({sc.count:,}×)")
            if full:
                for stack in sc.stacks:
                    lines.append("        stack:")
                    lines.extend(f"          {frame}" for frame in stack)
        if len(row.sites) > len(sites):
            lines.append(f"      … {len(row.sites) - len(sites)} more sites")
        if row.unattributed:
            lines.append(f"      {row.unattributed:,} calls without a user line")
    if len(rows) > len(shown):
        lines.append(f"  … {len(rows) - len(shown)} more ops (`%neuron report --full`)")


def render_text(r: Report, detail: str | None = None) -> str:
    detail = detail or r.detail
    head = summary_line(r)
    if detail == "summary":
        return head
    full = detail == "full"
    m = r.memory
    lines = [head,
             f"memory: {format_size(m.before)} → {format_size(m.after)} ({format_delta(m.delta)}), "
             f"peak {format_size(m.peak)} of {format_size(m.capacity)}; host RSS {format_delta(m.host_rss_delta)}"]
    if r.h2d_bytes or r.d2h_bytes:
        lines.append(f"copies: host→device {format_size(r.h2d_bytes)}, device→host {format_size(r.d2h_bytes)}")
    if r.fallbacks:
        _rows(lines, "CPU fallbacks", r.fallbacks, full)
    if r.downcasts:
        _rows(lines, "64-bit downcasts", r.downcasts, full)
    c = r.compiles
    if c:
        lines.append(f"compile: {count(c.frames, 'frame compile')}, {count(c.graphs, 'graph')}, "
                     f"{format_seconds(c.compile_s)} "
                     f"compiling, {format_seconds(r.run_s)} running")
        for b in c.breaks if full else c.breaks[:FOLD]:
            where = f"{b.site.label}: {b.site.source}" if b.site else "unknown line"
            lines.append(f"  graph break at {where}\n      why: {b.reason}")
        for rc in c.recompiles if full else c.recompiles[:FOLD]:
            where = f" ({rc.site.label})" if rc.site else ""
            lines.append(f"  recompile of {rc.code}{where}\n      guard: {rc.reason}")
        for f in c.failures:
            lines.append(f"  compile failed: {f}")
    if not r.callsites and r.fallbacks:
        lines.append("call sites are off (`%config NeuronLab.callsites = True` turns them on)")
    lines += [str(c) if full else f"check: {c.summary_line()}" for c in r.checks]
    if r.error:
        lines.append(f"raised: {r.error}")
    return "\n".join(lines)
