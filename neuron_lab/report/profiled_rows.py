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
DEVICE_COLUMN = "device"
# the device profile's files by kind, as NRT names them (tnx:tests/profiler/test_profiler_integration.py:33-40,
# tnx:torch_neuronx/profiling.py:310-312): (test on the file name, what it holds)
ARTEFACT_KINDS: list[tuple[str, str]] = [
    (".ntff", "device trace"), (".neff", "compiled program (NEFF)"), ("ntrace.pb", "system trace"),
    ("trace_info.pb", "trace metadata"), ("cpu_util.pb", "CPU utilisation"), ("host_mem.pb", "host memory"),
    ("framework_mapping_", "framework-to-NRT op mapping"),
]


def ran_text(kind: str) -> str:
    """Where a profiled op ran, in a word or two: "native", "CPU fallback", "host op"."""
    return "native" if kind == kinds.NATIVE else kinds.KINDS[kind].call.removesuffix(" call") \
        if kind in kinds.KINDS else kind


TAKEN_OVER = ("profile: none: a torch.profiler started inside took torch.profiler over and ended it (profiles do not "
              "nest), so its own result holds the ops; profile one way or the other")


def profiled_head(p: Profiled) -> str:
    """The profile in one line: ops, device and host time, each lane's busy time (host time only, where the device
    gave no events: the backend's note says why)."""
    if p.taken_over:
        return TAKEN_OVER
    head = f"profile: {count(len(p.rows), 'op')}, {count(sum(r.calls for r in p.rows), 'call')}, "
    if not p.device_timing:
        return head + f"host {format_seconds(p.host_ns / 1e9)}"
    lanes = ", ".join(f"{lane} busy {format_seconds(ns / 1e9)}" for lane, ns in p.lanes.items())
    return (head + f"{p.device_label} {format_seconds(p.device_ns / 1e9)}, host {format_seconds(p.host_ns / 1e9)}"
            + (f" ({lanes})" if lanes else " (no device activity in the profile)"))


def device_notes(p: Profiled) -> list[str]:
    """What the profile's device side is, in the backend's words: why there is no device time, or what the device
    lanes are."""
    shown = p.lanes or not p.device_timing
    return [p.lanes_note] if shown and p.lanes_note else []


def artefact_kind(name: str) -> str:
    """What a device profile file holds, from its name ("device trace" for a ``.ntff``); "other" when unknown."""
    base = name.rsplit("/", 1)[-1]
    return next((what for test, what in ARTEFACT_KINDS
                 if base.endswith(test) or base.startswith(test)), "other")


def artefact_lines(p: Profiled) -> list[str]:
    """The device's own profile files: the folder, how to open it, then the files by kind."""
    if p.artefacts_dir is None:
        return []
    if not p.artefacts:
        return [f"device profile: {p.artefacts_dir} is empty (the device wrote no profile files)"]
    lines = [f"device profile: {p.artefacts_dir} ({count(len(p.artefacts), 'file')}; open it in Neuron Explorer: "
             f"neuron-explorer view -d {p.artefacts_dir})"]
    by_kind: dict[str, list[str]] = {}
    for f in p.artefacts:
        by_kind.setdefault(artefact_kind(f), []).append(f)
    order = [what for _, what in ARTEFACT_KINDS] + ["other"]
    return lines + [f"  {what}: {', '.join(by_kind[what])}" for what in order if what in by_kind]


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


def _device_column(p: Profiled, t: Table) -> Table:
    """The table with its device column labelled as the profile's device times are (:attr:`Profiled.device_label`),
    or without it where the device gave no events (no device time to show)."""
    i = t.header.index(DEVICE_COLUMN)
    if p.device_timing:
        return Table(t.header[:i] + [p.device_label] + t.header[i + 1:], t.rows)
    return Table(t.header[:i] + t.header[i + 1:], [r[:i] + r[i + 1:] for r in t.rows])


def profiled_tables(p: Profiled) -> list[tuple[str, str, Table]]:
    """The profile's tables that have rows, each as (title, the noun of its rows, table): ops by device + host time,
    then the time per line (by host time, without the device column, where the device gave no events)."""
    title = f"ops by {p.device_label} + host time" if p.device_timing else "ops by host time"
    tables = [(title, "op", Table(PROFILED_HEADER, profiled_rows(p))),
              ("time per line", "line", Table(LINE_HEADER, line_rows(p)))]
    tables = [(name, noun, _device_column(p, t)) for name, noun, t in tables]
    return [t for t in tables if t[2].rows]


def unattributed_text(p: Profiled) -> str:
    return f"{format_seconds(p.unattributed_ns / 1e9)} in calls without a user line"


def timeline_head(t: ProfiledTimeline) -> str:
    """The timeline in one line: its length, lanes and events, and what the cap merged or left out."""
    capped = [f"{t.merged:,} merged into neighbouring spans"] if t.merged else []
    capped += [f"{t.dropped:,} of the shortest left out"] if t.dropped else []
    return (f"timeline: {format_seconds(t.duration_ns / 1e9)}, {count(len(t.lanes), 'lane')}, "
            f"{count(t.events, 'event')}" + (f" ({', '.join(capped)})" if capped else ""))
