"""Several ranks' Chrome traces of one window merged into one, with the ranks side by side (pure JSON, no torch).

Each rank's torch.profiler export has its host process (pid = the OS pid) and a process per device lane
(``neuron:R``, pid = the device index); in the merged trace rank R's host process is named ``rank R`` and its
device lanes ``rank R neuron:R``, each with a pid of its own, sorted by rank. Kineto timestamps are wall-clock:
an event happened at ``baseTimeNanoseconds + ts * 1000`` (ns since the epoch), and every process on one
machine reads the same clock, but each process picks its own base; so each rank's events are shifted by its
base's distance from the earliest base, which puts all ranks on one time axis.
"""

from __future__ import annotations

from typing import Any

_BASE = "baseTimeNanoseconds"
_LANES = 1000  # sort indices per rank: the host process first, then its devices, then the rest
_FLOWS = ("s", "t", "f")  # flow events: their ids link a host op to its device work within one rank
_RENAMED = ("process_name", "process_labels", "process_sort_index")  # each rank's processes are named anew


def merge(traces: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """One trace from ``{rank: trace}``; the ranks in rank order, their events on one time axis."""
    ranks = sorted(traces)
    base = min((traces[r].get(_BASE, 0) for r in ranks), default=0)
    out: dict[str, Any] = {"schemaVersion": 1, "displayTimeUnit": "ms", _BASE: base, "traceEvents": [],
                           "ranks": []}
    pids: dict[tuple[int, Any], int] = {}
    for r in ranks:
        trace = traces[r]
        shift_us = (trace.get(_BASE, 0) - base) / 1000
        lanes = _lanes(trace["traceEvents"])
        out["traceEvents"].extend(_moved(e, r, ranks[-1] + 1, shift_us, pids) for e in trace["traceEvents"]
                                  if not (e.get("ph") == "M" and e.get("name") in _RENAMED))
        for (rank, old), pid in pids.items():
            if rank == r:
                out["traceEvents"].extend(_named(pid, r, lanes.get(old, str(old) or "trace")))
        out["ranks"].append({"rank": r, _BASE: trace.get(_BASE, 0),
                             **{k: trace[k] for k in ("distributedInfo", "deviceProperties") if k in trace}})
    return out


def _lanes(events: list[dict[str, Any]]) -> dict[Any, str]:
    """Each process's name in one rank's trace: the host's labels say ``CPU``, a device's its lane."""
    names = {e["pid"]: e["args"].get("name", "") for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    labels = {e["pid"]: e["args"].get("labels", "") for e in events
              if e.get("ph") == "M" and e.get("name") == "process_labels"}
    return {pid: "host" if labels.get(pid) == "CPU" else name for pid, name in names.items()}


def _moved(e: dict[str, Any], rank: int, world: int, shift_us: float,
           pids: dict[tuple[int, Any], int]) -> dict[str, Any]:
    """The event in the merged trace: its rank's pid, its time on the common axis, its flow id unique."""
    e = dict(e)
    if "pid" in e:
        e["pid"] = pids.setdefault((rank, e["pid"]), len(pids) + 1)
    if isinstance(e.get("ts"), (int, float)):
        e["ts"] = e["ts"] + shift_us
    if e.get("ph") in _FLOWS and isinstance(e.get("id"), int):
        e["id"] = e["id"] * world + rank
    return e


def _named(pid: int, rank: int, lane: str) -> list[dict[str, Any]]:
    """The metadata that names and orders one process of a rank (``lane``: ``host``, ``neuron:0``, or Kineto's own
    unnamed processes, ``Spans`` and ``Traces``)."""
    if lane == "host":
        name, order = f"rank {rank}", 0
    elif lane.rpartition(":")[2].isdigit():
        name, order = f"rank {rank} {lane}", 1 + int(lane.rpartition(":")[2])
    else:
        name, order = f"rank {rank} {lane}", _LANES - 1
    return [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}},
            {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
             "args": {"sort_index": rank * _LANES + min(order, _LANES - 1)}}]
