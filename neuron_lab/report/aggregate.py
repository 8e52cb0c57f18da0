"""Many windows as one: the session-wide rows the fallback inspector shows for "all cells"."""

from __future__ import annotations

from collections.abc import Iterable

from neuron_lab.report.model import OpRow, Report, SiteCount

_ORDER = {"fallback": 0, "host": 1, "downcast": 2}


def merge_rows(reports: Iterable[Report]) -> list[OpRow]:
    """One row per (op, kind) over ``reports``: counts and host time summed, sites kept per cell line.

    The first call's shapes and dtypes and the reason come from the earliest report that has the op.
    """
    rows: dict[tuple[str, str], OpRow] = {}
    sites: dict[tuple[str, str], dict[tuple, SiteCount]] = {}
    for report in reports:
        for r in report.ops_not_native:
            key = (r.op, r.kind)
            m = rows.get(key)
            if m is None:
                m = rows[key] = OpRow(r.op, r.kind, r.reason, shapes=r.shapes, dtypes=r.dtypes)
                sites[key] = {}
            m.count += r.count
            m.host_ns += r.host_ns
            m.unattributed += r.unattributed
            for sc in r.sites:
                where = (sc.site.filename, sc.site.line, sc.site.cell)
                into = sites[key].get(where)
                if into is None:
                    into = sites[key][where] = SiteCount(sc.site)
                    m.sites.append(into)
                into.count += sc.count
                into.stacks.extend(st for st in sc.stacks if st not in into.stacks)
    for m in rows.values():
        m.sites.sort(key=lambda s: (-s.count, s.site.cell or 0, s.site.line))
    return sorted(rows.values(), key=lambda r: (_ORDER.get(r.kind, 3), -r.count, r.op))
