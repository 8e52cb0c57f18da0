"""Many windows as one: the session-wide rows the fallback inspector shows for "all cells", and a run's Report."""

from __future__ import annotations

from collections.abc import Iterable

from neuron_lab import kinds
from neuron_lab.report.model import Compiles, Memory, OpRow, Report, SiteCount


def merge_rows(reports: Iterable[Report]) -> list[OpRow]:
    """One row per (op, kind, group size) over ``reports``: counts and host time summed, sites kept per cell line.

    The first call's shapes and dtypes and the reason come from the earliest report that has the op.
    """
    merged: dict[tuple[str, str, int], tuple[OpRow, dict[tuple, SiteCount]]] = {}  # a row and its sites
    for report in reports:
        for r in report.ops_not_native:
            key = (r.op, r.kind, r.ranks)
            found = merged.get(key)
            if found is None:
                found = merged[key] = (OpRow(r.op, r.kind, r.reason, shapes=r.shapes, dtypes=r.dtypes, ranks=r.ranks,
                                             rewrite=r.rewrite), {})
            m, sites = found
            m.count += r.count
            m.host_ns += r.host_ns
            m.nbytes += r.nbytes
            m.unattributed += r.unattributed
            for sc in r.sites:
                s = sc.site  # told apart by its fields, as Site's == does, with no Python call to hash it
                where = (s.filename, s.line, s.source, s.cell, sc.via)
                into = sites.get(where)
                if into is None:
                    into = sites[where] = SiteCount(sc.site, via=sc.via)
                    m.sites.append(into)
                into.count += sc.count
                for st in sc.stacks:
                    if st not in into.stacks:
                        into.stacks.append(st)
    rows = [m for m, _ in merged.values()]
    for m in rows:
        m.sites.sort(key=lambda s: (-s.count, s.site.cell or 0, s.site.line))
    return sorted(rows, key=kinds.row_order)


def merge_reports(rs: list[Report]) -> Report:
    """One Report for many consecutive windows: counts and times summed, memory from first to last, peak the max."""
    modes, coverages = {r.mode for r in rs}, {r.coverage for r in rs}
    total = Report("run", None, rs[-1].device if rs else "?", modes.pop() if len(modes) == 1 else "mixed",
                   rs[0].backend if rs else "", ops_not_native=merge_rows(rs), callsites=all(r.callsites for r in rs),
                   coverage=coverages.pop() if len(coverages) == 1 else ", ".join(sorted(c for c in coverages if c)))
    if not rs:
        return total
    known = [r.memory.capacity for r in rs if r.memory.capacity is not None]  # None: before the runtime was up
    total.memory = Memory(rs[0].memory.before, rs[-1].memory.after, max(r.memory.peak for r in rs),
                          max(known, default=None), sum(r.memory.host_rss_delta for r in rs))
    c = total.compiles = Compiles()
    for r in rs:
        total.wall_s += r.wall_s
        total.ops += r.ops
        total.h2d_bytes += r.h2d_bytes
        total.d2h_bytes += r.d2h_bytes
        c.frames += r.compiles.frames
        c.graphs += r.compiles.graphs
        c.compile_s += r.compiles.compile_s
        c.breaks += r.compiles.breaks
        c.recompiles += r.compiles.recompiles
        c.failures += r.compiles.failures
    return total
