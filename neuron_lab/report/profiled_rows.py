"""A profiled window's facts (``report.profiled``: ``%%neuron profile``, ``neuron_lab.profile()``) as
renderer-neutral rows and sentences: the op table, the time per line, the heads of the profile and its timeline."""

from __future__ import annotations

from neuron_lab import kinds
from neuron_lab.report.model import LineTime, Profiled, ProfiledOp, ProfiledTimeline
from neuron_lab.report.rows import Table
from neuron_lab.units import count, format_seconds

PERFETTO = "https://ui.perfetto.dev"
PROFILED_HEADER = ["op", "ran", "calls", "device", "host", "first shapes", "issued at"]
LINE_HEADER = ["line", "calls", "device", "host", "source"]


def ran_text(kind: str) -> str:
    """Where a profiled op ran, in a word or two: "native", "CPU fallback", "host op"."""
    return "native" if kind == kinds.NATIVE else kinds.KINDS[kind].call.removesuffix(" call") \
        if kind in kinds.KINDS else kind


def profiled_head(p: Profiled) -> str:
    """The profile in one line: ops, device and host time, each lane's busy time."""
    lanes = ", ".join(f"{lane} busy {format_seconds(ns / 1e9)}" for lane, ns in p.lanes.items())
    return (f"profile: {count(len(p.rows), 'op')}, {count(sum(r.calls for r in p.rows), 'call')}, "
            f"device {format_seconds(p.device_ns / 1e9)}, host {format_seconds(p.host_ns / 1e9)}"
            + (f" ({lanes})" if lanes else " (no device activity in the profile)"))


def profiled_rows(p: Profiled) -> list[list[str]]:
    """The op table's rows (:data:`PROFILED_HEADER`), the most device + host time first."""
    def shapes(r: ProfiledOp) -> str:
        if r.dtypes:
            return ", ".join(f"{list(s)} {d}" for s, d in zip(r.shapes, r.dtypes))
        return ", ".join(str(list(s)) for s in r.shapes)

    def at(r: ProfiledOp) -> str:
        where = r.sites[0].site.label if r.sites else "no user line"
        more = len(r.sites) - 1 + (1 if r.sites and r.unattributed else 0)
        return where + (f" (+{count(more, 'more line')})" if more > 0 else "")

    return [[r.op, ran_text(r.kind), f"{r.calls:,}", format_seconds(r.device_ns / 1e9),
             format_seconds(r.host_ns / 1e9), shapes(r), at(r)] for r in p.rows]


def line_rows(p: Profiled) -> list[list[str]]:
    """Time per user line (:data:`LINE_HEADER`), the most device + host time first."""
    def one(x: LineTime) -> list[str]:
        return [x.site.label, f"{x.calls:,}", format_seconds(x.device_ns / 1e9), format_seconds(x.host_ns / 1e9),
                x.site.source]

    return [one(x) for x in p.lines]


def profiled_tables(p: Profiled) -> list[tuple[str, str, Table]]:
    """The profile's tables that have rows, each as (title, the noun of its rows, table): ops by device + host time,
    then the time per line."""
    tables = [("ops by device + host time", "op", Table(PROFILED_HEADER, profiled_rows(p))),
              ("time per line", "line", Table(LINE_HEADER, line_rows(p)))]
    return [t for t in tables if t[2].rows]


def unattributed_text(p: Profiled) -> str:
    return f"{format_seconds(p.unattributed_ns / 1e9)} in calls without a user line"


def timeline_head(t: ProfiledTimeline) -> str:
    """The timeline in one line: its length, lanes and events, and what the cap merged or left out."""
    capped = [f"{t.merged:,} merged into neighbouring spans"] if t.merged else []
    capped += [f"{t.dropped:,} of the shortest left out"] if t.dropped else []
    return (f"timeline: {format_seconds(t.duration_ns / 1e9)}, {count(len(t.lanes), 'lane')}, "
            f"{count(t.events, 'event')}" + (f" ({', '.join(capped)})" if capped else ""))
