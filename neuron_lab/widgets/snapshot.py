"""The data every view shows, as JSON: the report model's own data (``as_data``), plus what only the session has.

Rows are the cells' :class:`~neuron_lab.report.model.Report` fields under their own names (a memory row is a
report's ``cell``, ``wall_s`` and ``memory``; an op row is an :class:`~neuron_lab.report.model.OpRow`), and
the header carries the op-kind table (:func:`neuron_lab.kinds.as_json`), how reports group the kinds into
sections (:func:`neuron_lab.kinds.sections`) and the views' titles, so the widget (``panel.js``) spells none of
them. What only the session has: the memory timeline and the device tensors' holders (a row with its shape's text,
:func:`shape_text`). The static views (``static.py``) read the same JSON. ``live()`` is the part that changes while
a cell runs: counter reads and the running cell's op rows (copied under the trace's lock), so the refresh thread
may call it; with ranks started, the hub adds their rows to it (:func:`ranks`), each rank's own counters.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from neuron_lab import backend as _backend
from neuron_lab import kinds
from neuron_lab.backend import coverage
from neuron_lab.report.aggregate import merge_rows
from neuron_lab.report.checks_rows import check_summary_line
from neuron_lab.report.model import SOURCE, Report, as_data
from neuron_lab.report.ranks import ranks_label
from neuron_lab.report.waits import compiling_line
from neuron_lab.session.rank_pulse import RUNNING
from neuron_lab.units import count, format_capacity

TITLES = {"memory": "Memory", "tensors": "Tensors", "fallbacks": kinds.title(kinds.FALLBACK), "compiles": "Compiles"}
VIEWS = tuple(TITLES)  # the views, in tab order: the one list (``%neuron dashboard``, ``neuron_lab.show``)
STRIP = "strip"  # the line under a running cell (``auto_dashboard``): the header and ``live`` only
CELL_ROWS = 50  # per-cell rows the memory and compile views keep (newest)
RANK_COLUMNS = ("rank", "device", "memory", "peak", "capacity", "fallbacks", "status")  # live["ranks"], per host


def header(session: Any) -> dict[str, Any]:
    cov = _backend.active().coverage if _backend.is_active() else None
    if cov is None:
        hint = "the backend reports what ran natively; there is no coverage to switch"
    else:
        hint = (f"switch with `%neuron coverage NAME` (bundled: {', '.join(coverage.bundled())}, or a JSON file), "
                f"or {coverage.ENV_VAR}=NAME before the kernel starts")
    return {"device": str(session.device), "mode": session.mode,
            "backend": _backend.active().name if _backend.is_active() else "none",
            "coverage": cov.name if cov else None, "coverage_hint": hint, "kinds": kinds.as_json(),
            "sections": [[k.name, [n for n in kinds.KINDS if n in members]] for k, members in kinds.sections()],
            "titles": TITLES, "rank_columns": list(RANK_COLUMNS), "reason_source": SOURCE}


def as_of(session: Any) -> dict[str, Any]:
    """Whose state the data is: the newest cell run (the running one, or the last), when, on the timeline, and
    ``stamp``, the words a copy of it says where it cannot move (a static snapshot, a view whose kernel is gone)."""
    cell = session.locator.newest_cell()
    label = f"In[{cell or '?'}]"  # no cell yet: a view opened from a script
    when = f"while {label} ran" if session.running is not None else f"at the end of {label}"
    return {"cell": cell, "t": round(session.timeline.now(), 3), "stamp": f"snapshot {when}, not live"}


def live(session: Any) -> dict[str, Any]:
    """What moves while a cell runs; safe from the refresh thread."""
    if not _backend.is_active():
        return {"busy": session.running is not None, "allocated": 0, "peak": 0, "capacity": 0}
    b = _backend.active()
    allocated, peak = b.memory_sample(session.device)
    capacity = b.capacity()  # None until the runtime is up (TorchNeuron): the views say so, in the one phrase
    d: dict[str, Any] = {"busy": False, "allocated": allocated, "peak": peak, "capacity": capacity,
                         "capacity_text": format_capacity(capacity),
                         "t": round(session.timeline.now(), 3), "mode": session.mode, "device": str(session.device)}
    tracker = session.running
    if tracker is not None:  # the running cell's: its counters, its op rows so far, a compile in progress
        fallback_calls, syncs, ops, elapsed = tracker.live()
        d.update(busy=True, cell=session.running_cell(), fallback_calls=fallback_calls, syncs=syncs,
                 syncs_text=count(syncs, kinds.KINDS[kinds.SYNC].call), ops=ops,
                 elapsed_s=round(elapsed, 3), mode=tracker.report.mode, device=tracker.report.device,
                 rows=_rows_so_far(tracker), compiling=_compiling(tracker))
    elif session.history:
        last = _last(session)
        d.update(cell=last.cell, fallback_calls=last.fallback_calls, syncs=last.sync_calls,
                 syncs_text=count(last.sync_calls, kinds.KINDS[kinds.SYNC].call), ops=last.ops,
                 elapsed_s=round(last.wall_s, 3))
    return d


def ranks(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The ranks' rows (``session.rank_pulse.Listener.rows``, ordered by host) as ``live["ranks"]``: a heading, then
    per host its heading and its rows, each with its status in words (the running cell named)."""
    hosts: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        running = r["status"] == RUNNING and r.get("cell")
        hosts.setdefault(r["host"], []).append({**r, "status_text": f"{r['status']} In[{r['cell']}]" if running
                                                else r["status"]})
    return {"head": f"ranks: {count(len(rows), 'rank')} on {count(len(hosts), 'host')}",
            "hosts": [{"host": host, "head": f"{host or 'this host'}: {'rank' if len(mine) == 1 else 'ranks'} "
                                             f"{ranks_label(r['rank'] for r in mine)}", "rows": mine}
                      for host, mine in hosts.items()]}


def _rows_so_far(tracker: Any) -> list[dict[str, Any]]:
    """The running cell's op rows without their stacks: the tab shows sites, and this is sent a few times a second."""
    rows = as_data(tracker.rows_so_far())
    for row in rows:
        for site in row["sites"]:
            site["stacks"] = []
    return rows


def _compiling(tracker: Any) -> dict[str, Any] | None:
    """The compile in progress (``Tracker.compiling()``) with its line in words (``text``: the progress line's), elapsed
    rounded so equal ticks send nothing."""
    c = tracker.compiling()
    return None if c is None else {**c, "elapsed_s": round(c["elapsed_s"], 1), "text": compiling_line(c)}


def _last(session: Any) -> Report | None:
    return next(reversed(session.history.values())) if session.history else None


def _newest(session: Any) -> list[Report]:
    return list(session.history.values())[-CELL_ROWS:]


def memory(session: Any) -> dict[str, Any]:
    """The timeline (``[seconds, bytes]`` points, the cells' spans, its marks) and each kept cell's memory."""
    return {"points": as_data(session.timeline.points()), "cells": as_data(session.timeline.cells()),
            "marks": as_data(session.timeline.marks()), "sampling": _sampling(session),
            "rows": [as_data(r, "cell", "wall_s", "memory") for r in _newest(session)]}


def _sampling(session: Any) -> str | None:
    """What the timeline does not show, when it does not sample inside cells (None: it does)."""
    if session.config.memory_sample_ms > 0:
        return None
    return ("sampled only at each cell's start and end (NeuronLab.memory_sample_ms = 0): inside a cell the line is "
            "straight, its peak is the cell's row")


def tensors(session: Any) -> dict[str, Any]:
    from neuron_lab.session.tensors import device_tensors

    # Built between cells: the cell's closing synchronize was the last device work, so a second would only add a
    # device sync a cell (on TorchNeuron each ends a fusion group); the workbench adds at most one.
    table = device_tensors(session.shell, synchronize=False).as_dict()
    for row in table["rows"]:
        row["shape_text"] = shape_text(row["shape"])
    return table


def shape_text(shape: list[int] | None) -> str:
    """A storage's shape as the Tensors view shows it, in the widget and as text: ``4×8``, ``[]`` for a 0-d tensor
    (a blank reads as a missing value), ``?`` where no tensor was found."""
    return "?" if shape is None else "×".join(map(str, shape)) or "[]"


def fallbacks(session: Any) -> dict[str, Any]:
    """The last cell's op rows and the session's, merged: what "this cell" and "all cells" show.

    Only those two: a payload per kept cell would grow with every cell of a long session.
    """
    last = _last(session)
    return {"last": last.cell if last else None,
            "cell": as_data(last.ops_not_native) if last else [],
            "all": as_data(merge_rows(r for r in session.history.values() if r.ops_not_native)),
            "callsites": session.config.callsites}


def compiles(session: Any) -> dict[str, Any]:
    """Each kept cell that compiled or made a check: its ``compiles``, and its checks in one line each (the full
    result is the cell's report), so the tab lists compile events, not check dumps."""
    rows = [{**as_data(r, "cell", "mode", "run_s", "compiles"), "checks": [check_summary_line(x) for x in r.checks]}
            for r in _newest(session) if r.compiles or r.checks]
    return {"rows": rows, "totals": as_data(session.totals)}


BUILDERS: dict[str, Callable[[Any], dict[str, Any]]] = {
    "memory": memory, "tensors": tensors, "fallbacks": fallbacks, "compiles": compiles}


def build(session: Any, views: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """The data of ``views`` (the strip needs only the header and ``live``)."""
    data = {"header": header(session), "as_of": as_of(session)}
    for v in views:
        if v in BUILDERS:
            data[v] = BUILDERS[v](session)
    return data
