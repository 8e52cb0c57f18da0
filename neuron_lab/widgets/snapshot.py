"""The data every view shows, as JSON-ready dicts built from the session and its reports.

One builder per view; the widget (``panel.js``) and the static renderers (``static.py``) read
these dicts and nothing else. ``live()`` is the part that changes while a cell runs: plain counter
reads, so the refresh thread may call it.
"""

from __future__ import annotations

from typing import Any

from neuron_lab import backend as _backend
from neuron_lab.backend import profiles
from neuron_lab.report.aggregate import merge_rows
from neuron_lab.report.model import OpRow, Site

VIEWS = ("memory", "tensors", "fallbacks", "compiles")
CELL_ROWS = 50  # per-cell rows the memory and compile views keep (newest)


def _site(site: Site | None) -> dict[str, Any] | None:
    if site is None:
        return None
    return {"cell": site.cell, "line": site.line, "source": site.source, "label": site.label}


def _op(row: OpRow) -> dict[str, Any]:
    return {"op": row.op, "kind": row.kind, "reason": row.reason, "count": row.count, "host_ms": row.host_ms,
            "shapes": [list(s) for s in row.shapes], "dtypes": list(row.dtypes), "unattributed": row.unattributed,
            "sites": [{**_site(sc.site), "count": sc.count} for sc in row.sites]}


def header(session: Any) -> dict[str, Any]:
    prof = _backend.active().profile if _backend.is_active() else None
    if prof is None:
        hint = "the backend reports what ran natively; there is no profile to switch"
    else:
        hint = (f"switch with `%neuron profile NAME` (bundled: {', '.join(profiles.bundled())}, or a JSON file), "
                f"or {profiles.ENV_VAR}=NAME before the kernel starts")
    return {"device": str(session.device), "mode": session.mode,
            "backend": _backend.active().name if _backend.is_active() else "none",
            "profile": prof.name if prof else None, "profile_hint": hint}


def live(session: Any) -> dict[str, Any]:
    """What moves while a cell runs; safe from the refresh thread."""
    if not _backend.is_active():
        return {"busy": session.running is not None, "allocated": 0, "peak": 0, "capacity": 0}
    b = _backend.active()
    allocated, peak = b.memory_sample()
    d: dict[str, Any] = {"busy": False, "allocated": allocated, "peak": peak, "capacity": b.capacity(),
                         "t": round(session.timeline.now(), 3), "mode": session.mode, "device": str(session.device)}
    tracker = session.running
    if tracker is not None:
        fallback_calls, ops, elapsed = tracker.live()
        d.update(busy=True, cell=session.running_cell(), fallback_calls=fallback_calls, ops=ops,
                 elapsed_s=round(elapsed, 3), mode=tracker.report.mode, device=tracker.report.device)
    elif session.history:
        last = next(reversed(session.history.values()))
        d.update(cell=last.cell, fallback_calls=last.fallback_calls, ops=last.ops, elapsed_s=round(last.wall_s, 3))
    return d


def memory(session: Any) -> dict[str, Any]:
    reports = list(session.history.values())[-CELL_ROWS:]
    return {
        "points": [[round(t, 3), b] for t, b in session.timeline.points()],
        "cells": [[c.cell, round(c.start_s, 3), round(c.end_s, 3)] for c in session.timeline.cells()],
        "rows": [{"cell": r.cell, "before": r.memory.before, "after": r.memory.after, "delta": r.memory.delta,
                  "peak": r.memory.peak, "wall_s": r.wall_s} for r in reports],
    }


def tensors(session: Any) -> dict[str, Any]:
    from neuron_lab.session.tensors import device_tensors

    return device_tensors(session.shell).as_dict()


def fallbacks(session: Any) -> dict[str, Any]:
    """The last cell's rows and the session's, merged: what "this cell" and "all cells" show.

    Only those two: a payload per kept cell would grow with every cell of a long session.
    """
    last = next(reversed(session.history.values())) if session.history else None
    return {"last": last.cell if last else None,
            "cell": [_op(x) for x in last.ops_not_native] if last else [],
            "all": [_op(x) for x in merge_rows(r for r in session.history.values() if r.ops_not_native)],
            "callsites": session.config.callsites}


def compiles(session: Any) -> dict[str, Any]:
    rows = []
    for r in list(session.history.values())[-CELL_ROWS:]:
        c = r.compiles
        checks = getattr(r, "checks", [])
        if not c and not checks:
            continue
        rows.append({
            "cell": r.cell, "mode": r.mode, "frames": c.frames, "graphs": c.graphs, "compile_s": c.compile_s,
            "run_s": r.run_s, "failures": list(c.failures),
            "breaks": [{"reason": b.reason, "site": _site(b.site)} for b in c.breaks],
            "recompiles": [{"code": x.code, "reason": x.reason, "site": _site(x.site)} for x in c.recompiles],
            "checks": [str(x) for x in checks],
        })
    t = session.totals
    return {"rows": rows, "totals": {"compiles": t.compiles, "graph_breaks": t.graph_breaks,
                                     "recompiles": t.recompiles}}


BUILDERS = {"memory": memory, "tensors": tensors, "fallbacks": fallbacks, "compiles": compiles}


def build(session: Any, views: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """The data of ``views`` (the strip needs only the header and ``live``)."""
    data = {"header": header(session)}
    for v in views:
        if v in BUILDERS:
            data[v] = BUILDERS[v](session)
    return data
