"""A window of work under torch.profiler, turned into report data: time per op and per user line.

The backend feeds torch.profiler (device kernels and copies on a lane per device, CPU fallbacks as host work
named "CPU fallback: aten::atan2"); this module reads what it recorded. Kineto keeps no user line for an op
in eager Python, so the lines come from the backend's own op events: while profiling, every op call of the
backend is located with the session's :class:`~neuron_lab.trace.sites.Locator` as it runs, and the k-th call
of an op is joined to the k-th profiled call of that op (both are in call order). Where the counts of an op
differ (an op the backend does not report, as the device-to-host copy of ``.item()``), its calls are left
without a line rather than given a wrong one.

A user's profile (``%%neuron profile``, ``neuron_lab.profile()``) leaves a :class:`ProfileResult`: the cell's value
and :func:`last_profile`. It keeps torch.profiler's own record of the window, so the Chrome/Perfetto trace and
torch's tables can be had afterwards, with torch.profiler's names (``export_chrome_trace``, ``key_averages``),
without running the code again.

Where the device hands torch.profiler nothing of its own (TorchNeuron: NRT writes files for Neuron Explorer
instead), the result says so (``device_timing`` False) and names those files; it never asks which backend runs.

The same events, with the device allocations the profiler records (``profile_memory``), make the window's
timeline (:mod:`neuron_lab.trace.profile_timeline`): what ran when on each lane, and each device's memory.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, NamedTuple

import torch
from torch._C._profiler import _ExperimentalConfig
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity

from neuron_lab import backend as _backend
from neuron_lab import settings
from neuron_lab.kinds import COLLECTIVE, KINDS, NATIVE, OFF_DEVICE, SYNC
from neuron_lab.report.model import (
    COPY,
    HOST_LANE,
    KERNEL,
    LineTime,
    Profiled,
    ProfiledOp,
    ProfiledTimeline,
    Report,
    Site,
)
from neuron_lab.report.profiled_rows import TAKEN_OVER
from neuron_lab.report.text import profiled_lines
from neuron_lab.trace import profile_timeline
from neuron_lab.trace.sites import FileLocator, Locator
from neuron_lab.trace.tracker import Tracker
from neuron_lab.units import count

# The host-work events the backend adds for off-device calls, by their name's prefix ("CPU fallback: aten::atan2")
_HOST_WORK = {KINDS[k].call.removesuffix(" call") + ": ": k for k in OFF_DEVICE}
DEFAULT_ROW_LIMIT = 10
# whether windows record device allocations (the timeline's memory curves); bench/profile_overhead.py measures it
PROFILE_MEMORY = True
MEMORY = "[memory]"  # the name of torch.profiler's allocation events (profile_memory=True)
COLLECTIVE_PREFIX = "c10d::"  # a collective on a device lane, from call to completion ("c10d::all_reduce.sum")
KINETO_QUIET = "6"


def quiet_kineto() -> None:
    """Kineto writes "USDT: ... profiler_start" and "profiler_stop" to stderr around every session at every log level
    below 6 (none keeps its warnings and drops these), and a notebook shows them under each profiled cell. It reads
    ``KINETO_LOG_LEVEL`` when its first session starts, so this is set before that; a level the user set is kept."""
    settings.env("KINETO_LOG_LEVEL").setdefault(KINETO_QUIET)


class _Call(NamedTuple):
    kind: str
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    where: tuple[str, int] | None  # (filename, line) of the user frame that issued it


class _Calls:
    """A backend subscriber: each op call's kind, shapes and user line, in call order per op name."""

    def __init__(self, locator: Locator) -> None:
        self.locator = locator
        self.by_name: dict[str, list[_Call]] = {}
        self._lock = threading.Lock()

    def __call__(self, event: Any, args: tuple, kwargs: dict) -> None:
        user = self.locator.user_frame(sys._getframe(1))
        where = None if user is None else (user.f_code.co_filename, user.f_lineno)
        call = _Call(event.kind, event.shapes, event.dtypes, where)
        with self._lock:
            self.by_name.setdefault(event.name, []).append(call)


def check_export_path(path: str, option: str = "--export") -> str:
    """The absolute path a trace will be written to; ValueError, before anything runs, when it cannot be (the message
    names ``option``, how the user gave the path)."""
    full = os.path.abspath(os.path.expanduser(path))
    folder = os.path.dirname(full)
    if os.path.isdir(full):
        raise ValueError(f"{option} {path}: is a directory; give a file name, e.g. "
                         f"{os.path.join(path, 'trace.json')}")
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise ValueError(f"{option} {path}: {folder} is a file, not a directory")
    if not os.path.isdir(folder):
        raise ValueError(f"{option} {path}: no directory {folder}")
    # tried by opening it: root passes os.access everywhere, and some folders take no new files (/proc); torch would
    # only log that it failed, after the profiled code ran
    existed = os.path.exists(full)
    try:
        with open(full, "a"):
            pass
    except OSError as e:
        raise ValueError(f"{option} {path}: cannot write into {folder}: {e.strerror}") from None
    if not existed:
        os.remove(full)
    return full


def check_row_limit(n: int) -> int:
    if n < 1:
        raise ValueError(f"--row-limit must be 1 or more, not {n}")
    return n


ARTEFACTS_FOLDER = "neuron_profile"  # under the cwd: where a device's own profile files go when nothing is exported


def artefacts_dir(label: str, export: str | None = None) -> str:
    """A new folder for the device's own profile files (not made here): next to the exported trace
    (``trace.json`` -> ``trace-neuron-1/``), else ``neuron_profile/<label>-<n>/`` under the cwd; ``n`` is the first
    number whose folder does not exist yet, so a profile never mixes its files with an earlier one's."""
    if export is not None:
        base, stem = os.path.split(os.path.abspath(export))
        stem = os.path.splitext(stem)[0] + "-neuron"
    else:
        base, stem = os.path.join(os.getcwd(), ARTEFACTS_FOLDER), "".join(c for c in label if c.isalnum()) or "profile"
    n = 1
    while os.path.exists(os.path.join(base, f"{stem}-{n}")):
        n += 1
    return os.path.join(base, f"{stem}-{n}")


def _files_in(folder: str) -> list[str]:
    """Every file under ``folder`` (NRT writes into a ``<instance>_pid_<pid>/`` folder inside it), relative, sorted."""
    return sorted(os.path.relpath(os.path.join(root, f), folder) for root, _, files in os.walk(folder) for f in files)


_YIELDING: list[OpProfile] = []  # the background profiles running now (``yields=True``), that any other stops


class OpProfile:
    """torch.profiler (CPU, and the device when a backend serves it) plus the backend's op events, from
    :meth:`start` to :meth:`stop`; :meth:`result` reads them into a :class:`Profiled`.

    ``with_stack`` adds torch's Python tracer: the exported trace then shows the Python frames above each op
    (worth it for a trace viewer; the tables do not need it, and it costs the profiled code about a third more).

    ``yields`` makes a background profile (``neuron-lab run --trace``'s, around each cell) that gives way to the
    user's: another OpProfile started while it runs stops it first, and a raw ``torch.profiler.profile()``
    ends its session anyway (Kineto runs one at a time); either way :attr:`gave_way` is then True, and what it
    holds is a part of the window at most: read nothing from it. A user's profile whose window started a raw
    ``torch.profiler.profile()`` gave way too (profiles do not nest): its result is empty and says so
    (``Profiled.taken_over``).

    Where the backend's device writes a profile of its own (TorchNeuron's NRT files, for Neuron Explorer), the
    backend's :meth:`~neuron_lab.backend.interface.NeuronBackend.profiler_config` sends it into a new folder
    (:func:`artefacts_dir` of ``label`` and ``export``), made before the profiler starts; the result lists its files.
    """

    def __init__(self, locator: Locator | None = None, *, with_stack: bool = False, yields: bool = False,
                 label: str = "profile", export: str | None = None) -> None:
        self._calls = _Calls(locator if locator is not None else FileLocator())
        activities = [ProfilerActivity.CPU]
        self._device_timing, self._artefacts_dir, config = True, None, None
        self._device_clock, self._lanes_note = "device", None
        if _backend.is_active():
            activities.append(ProfilerActivity.PrivateUse1)
            device = _backend.active()
            self._device_timing = device.device_timing
            self._device_clock, self._lanes_note = device.device_clock, device.device_lanes
            folder = artefacts_dir(label, export)
            config = device.profiler_config(folder)
            self._artefacts_dir = folder if config is not None else None
        extra = {} if config is None else {"experimental_config": _ExperimentalConfig(custom_profiler_config=config)}
        self._prof: Any = torch.profiler.profile(activities=activities, record_shapes=True, with_stack=with_stack,
                                                 profile_memory=PROFILE_MEMORY, **extra)
        self._baselines: dict[str, int] = {}
        self._unsubscribe: Any = None
        self._running = False
        self._yields = yields
        self._done: tuple[Profiled, Any] | None = None  # what result() read, and torch.profiler's record
        self.gave_way = False

    def start(self) -> OpProfile:
        for background in list(_YIELDING):
            background.gave_way = True
            background.stop()
        if torch._C._autograd._profiler_enabled():  # a second session would silently take the first one's events
            raise ValueError("torch.profiler is already running: profiles do not nest; stop the other one first")
        if _backend.is_active() and PROFILE_MEMORY:
            self._baselines = _allocated()
        if self._artefacts_dir is not None:
            os.makedirs(self._artefacts_dir, exist_ok=True)
        quiet_kineto()
        self._prof.__enter__()
        self._running = True
        if _backend.is_active():
            # every op call but the syncs: those are reads the calls already are, not calls of their own
            self._unsubscribe = _backend.active().subscribe(self._calls, frozenset(KINDS) - {SYNC})
        if self._yields:
            _YIELDING.append(self)
        return self

    def stop(self) -> None:
        """Idempotent."""
        if not self._running:
            return
        self._running = False
        if self in _YIELDING:
            _YIELDING.remove(self)
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        if not torch._C._autograd._profiler_enabled():  # a torch.profiler the window started took ours over and
            self.gave_way = True  # ended it (exiting now would only log Kineto's "no active profiling session")
            return
        self._prof.__exit__(None, None, None)

    def result(self, *, export: str | None = None, row_limit: int = DEFAULT_ROW_LIMIT) -> Profiled:
        """The profile as report data; with ``export``, the Chrome/Perfetto trace written there first."""
        self.stop()
        prof, self._prof = self._prof, None
        if prof is None:
            raise RuntimeError("OpProfile.result() reads a profile once")
        if self.gave_way:  # torch.profiler's session, and the window's events, went to the profiler that took it
            self._done = (Profiled(row_limit=row_limit, taken_over=True), prof)
            return self._done[0]
        if export is not None:
            prof.export_chrome_trace(export)
        out = _read(prof.profiler.kineto_results, self._calls, self._baselines)
        out.trace_path, out.row_limit, out.device_timing = export, row_limit, self._device_timing
        out.device_clock, out.lanes_note = self._device_clock, self._lanes_note
        if self._artefacts_dir is not None:
            out.artefacts_dir, out.artefacts = self._artefacts_dir, _files_in(self._artefacts_dir)
        self._done = (out, prof)
        return out

    def keep(self, report: Report | None = None) -> ProfileResult:
        """The read profile (:meth:`result`) as what a user's profile leaves: its value and :func:`last_profile`."""
        if self._done is None:
            raise RuntimeError("OpProfile.keep() keeps what result() read: call result() first")
        profiled, prof = self._done
        kept = ProfileResult(profiled, prof, report)
        _LAST[:] = [kept]
        return kept


_LAST: list[ProfileResult] = []  # the newest user profile of this process: last_profile()


def last_profile() -> ProfileResult:
    """The newest profile of this process (a ``%%neuron profile`` cell's, a ``neuron_lab.profile()`` block's)."""
    if not _LAST:
        raise RuntimeError("no profile yet: run a `%%neuron profile` cell or a `with neuron_lab.profile():` block "
                           "first")
    return _LAST[0]


class ProfileResult:
    """A finished profile, after the fact: its report data (:attr:`profiled`, :attr:`report`) and torch.profiler's
    record of the window, which it exports and tabulates with torch.profiler's names. It holds that record (its
    memory) for as long as it lives: in ``Out`` and ``_`` for a cell, and as :func:`last_profile` until the next.
    A written trace stays on disk, not in memory (tens of MB for a few thousand ops with their stacks)."""

    def __init__(self, profiled: Profiled, prof: Any, report: Report | None = None) -> None:
        self.profiled = profiled
        self.report = report  # the cell's or block's report, the profile on it; None outside one
        self._prof = prof  # torch.profiler.profile, stopped and read
        # torch.profiler writes a window's trace once ("Trace is already saved" after): the file it went to last
        self._written = None if profiled.trace_path is None else _Written.at(profiled.trace_path)

    def export_chrome_trace(self, path: str) -> None:
        """Write the window's Chrome/Perfetto trace (https://ui.perfetto.dev) with the device lanes, as
        ``--export`` does, as often as asked; the Python frames above each op are in it only when the profile ran
        with ``--export`` (they cost the profiled code about a third more). The profile's ``trace_path`` says where
        it went last."""
        full = check_export_path(path, "export_chrome_trace")
        if self._written is None:
            self._record().export_chrome_trace(full)
        else:
            _write_trace(full, self._written.read())
        self._written = _Written.at(full)
        self.profiled.trace_path = full

    def _record(self) -> Any:
        """torch.profiler's record of the window; none where a profiler the window started took the session over."""
        if self.profiled.taken_over:
            raise RuntimeError(TAKEN_OVER)
        return self._prof

    def key_averages(self, group_by_input_shape: bool = False, group_by_stack_n: int = 0) -> Any:
        """torch.profiler's own table of the window (``.key_averages().table(sort_by="self_cpu_time_total")``)."""
        return self._record().key_averages(group_by_input_shape=group_by_input_shape, group_by_stack_n=group_by_stack_n)

    def table(self, row_limit: int | None = None) -> str:
        """neuron_lab's tables of the window (ops by device + host time, time per line), every row unless
        ``row_limit``: the profile section of the cell's report, as text."""
        if row_limit is None:
            return "\n".join(profiled_lines(self.profiled, full=True))
        return "\n".join(profiled_lines(replace(self.profiled, row_limit=check_row_limit(row_limit))))

    def __repr__(self) -> str:
        p = self.profiled
        if p.taken_over:
            return f"<neuron_lab {TAKEN_OVER}>"
        return (f"<neuron_lab profile: {count(len(p.rows), 'op')}, {count(sum(r.calls for r in p.rows), 'call')}; "
                ".export_chrome_trace(path), .table(), .key_averages()>")


_TRACE_NAME = b'"traceName": '  # the last key of Kineto's trace: the path it was written to


class _Written(NamedTuple):
    """A trace file as its profile wrote it: read back only to write it again, and only while it is unchanged."""

    path: str
    size: int
    mtime_ns: int

    @classmethod
    def at(cls, path: str) -> _Written:
        st = os.stat(path)
        return cls(path, st.st_size, st.st_mtime_ns)

    def read(self) -> bytes:
        """Its JSON (torch.profiler gzips a ``.gz`` path)."""
        try:
            unchanged = _Written.at(self.path) == self
        except OSError:
            unchanged = False
        if not unchanged:
            raise RuntimeError(f"export_chrome_trace: the profile's trace was written to {self.path}, which has "
                               "changed or is gone since; torch.profiler writes a window's trace once, so put that "
                               "file back or profile again")
        with (gzip.open if self.path.endswith(".gz") else open)(self.path, "rb") as f:
            return f.read()


def _write_trace(path: str, trace: bytes) -> None:
    """A trace's JSON written again, as torch.profiler would write it to ``path``: named by it, gzipped for ``.gz``."""
    head, key, _ = trace.rpartition(_TRACE_NAME)
    if key:
        trace = head + key + json.dumps(path).encode() + b" }"
    with (gzip.open if path.endswith(".gz") else open)(path, "wb") as f:
        f.write(trace)


class _Event(NamedTuple):
    """One profiled event, read once from Kineto's own events (FunctionEvents cost ~25 µs each to build)."""

    name: str
    device: str  # "" for host events, else the lane ("neuron:0")
    start: int  # ns
    end: int
    cid: int  # correlation id (a host op's)
    linked: int  # the host op's correlation id, for device and host-work events
    thread: int
    kineto: Any  # Kineto's event, for the shapes of the few ops no backend call describes

    @property
    def shapes(self) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(x) for x in self.kineto.shapes() if x)


def _events(results: Any) -> list[_Event]:
    out = []
    cpu = DeviceType.CPU
    for k in results.events():
        try:
            name = k.name()
        except UnicodeDecodeError:  # torch's Python tracer can leave a frame unnamed (seen under IPython tracebacks)
            continue
        dt = k.device_type()
        start = k.start_ns()
        device = "" if dt == cpu else f"{dt.name.lower()}:{k.device_index()}"
        out.append(_Event(name, device, start, start + k.duration_ns(), k.correlation_id(),
                          k.linked_correlation_id(), k.start_thread_id(), k))
    return out


def _busy_ns(spans: list[tuple[int, int]]) -> int:
    """The length of the union of intervals."""
    total, end = 0, None
    for s, e in sorted(spans):
        if end is None or e > end:
            total += e - (s if end is None else max(s, end))
            end = e
    return total


def _contained(ops: list[_Event]) -> dict[int, list[_Event]]:
    """For each op (by correlation id), the ops of ``ops`` that ran inside it on its thread."""
    inside: dict[int, list[_Event]] = {}
    by_thread: dict[int, list[_Event]] = {}
    for e in ops:
        by_thread.setdefault(e.thread, []).append(e)
    for run in by_thread.values():
        run.sort(key=lambda e: (e.start, -e.end))
        for i, e in enumerate(run):
            for f in run[i + 1:]:
                if f.start >= e.end:
                    break
                if f.end <= e.end:
                    inside.setdefault(e.cid, []).append(f)
    return inside


def _allocated() -> dict[str, int]:
    """Bytes allocated on each device now, by lane name ("neuron:0"): where the memory curves start."""
    b = _backend.active()
    return {f"{b.device_type}:{i}": b.memory_reading(i, synchronize=False).allocated for i in range(b.device_count())}


def _timeline(results: Any, events: list[_Event], host_work: dict[int, str],
              baselines: dict[str, int]) -> ProfiledTimeline:
    """The spans of the device lanes (kernels, copies) and of the host lane (off-device calls' host work), and
    each device's memory curve from its allocation events."""
    lanes: dict[str, list[tuple[int, int, str, str]]] = {}
    allocations: dict[str, list[tuple[int, int]]] = {}
    for e in events:
        if e.name == MEMORY:
            if e.device:
                allocations.setdefault(e.device, []).append((e.start, e.kineto.nbytes()))
        elif e.device:
            kind = COPY if e.name.startswith("Memcpy") else COLLECTIVE if e.name.startswith(COLLECTIVE_PREFIX) \
                else KERNEL
            lanes.setdefault(e.device, []).append((e.start, e.end, e.name, kind))
        elif id(e) in host_work:
            op = e.name.partition(": ")[2]  # "CPU fallback: aten::atan2" -> "aten::atan2"
            lanes.setdefault(HOST_LANE, []).append((e.start, e.end, op, host_work[id(e)]))
    return profile_timeline.build(results.trace_start_ns(), lanes, allocations, baselines)


def _host_work(events: list[_Event]) -> dict[int, str]:
    """The host-work events the backend added for off-device calls (by ``id``), each with its kind."""
    return {id(e): k for e in events if not e.device for prefix, k in _HOST_WORK.items() if e.name.startswith(prefix)}


def _lane_busy(events: list[_Event]) -> dict[str, int]:
    """Each device lane's busy time, by lane name."""
    lanes: dict[str, list[tuple[int, int]]] = {}
    for e in events:
        if e.device:
            lanes.setdefault(e.device, []).append((e.start, e.end))
    return {lane: _busy_ns(spans) for lane, spans in sorted(lanes.items())}


def _owned(events: list[_Event], ops: dict[int, _Event], host_work: dict[int, str]) -> dict[int, list[_Event]]:
    """Each op's device events and host-work events, by the op's correlation id."""
    owned: dict[int, list[_Event]] = {}
    for e in events:
        if (e.device or id(e) in host_work) and e.linked in ops:
            owned.setdefault(e.linked, []).append(e)
    return owned


def _profiled_calls(ops: dict[int, _Event], owners: list[_Event], calls: _Calls) -> dict[str, list[_Event]]:
    """Each op name's profiled calls, in call order: the ops with device or host work, else (no device activity in
    the profile) the innermost op of that name."""
    by_name: dict[str, list[_Event]] = {}
    for op in sorted(owners, key=lambda e: e.start):
        by_name.setdefault(op.name, []).append(op)
    missing = [e for e in ops.values() if e.name in calls.by_name and e.name not in by_name]
    inner = _contained(missing)
    for op in sorted(missing, key=lambda e: e.start):
        if not any(f.name == op.name for f in inner.get(op.cid, ())):
            by_name.setdefault(op.name, []).append(op)
    return by_name


def _paired(made: list[_Call], profiled: list[_Event]) -> list[_Call | None]:
    """The backend's call for each profiled call, k-th with k-th; none at all when the counts differ (no line rather
    than a wrong one)."""
    return list(made) if len(made) == len(profiled) else [None] * len(profiled)


def _op_ns(op: _Event, work: list[_Event], nested: list[_Event]) -> tuple[int, int]:
    """An op call's device time and its own host time: less the ops inside it and, as the emulator runs a kernel on
    the calling thread inside its op, less its device time."""
    dev = [e for e in work if e.device]
    overlap = sum(max(0, min(op.end, e.end) - max(op.start, e.start)) for e in dev)
    host_ns = max(op.end - op.start - overlap - sum(f.end - f.start for f in nested), 0)
    return sum(e.end - e.start for e in dev), host_ns


def _unreported_kind(work: list[_Event], host_work: dict[int, str]) -> str:
    """The kind of an op call no backend call describes: from its host work, else a copy when its device work is only
    copies (``.item()``), else native."""
    dev = [e for e in work if e.device]
    return next((host_work[id(e)] for e in work if id(e) in host_work),
                COPY if dev and all(e.name.startswith("Memcpy") for e in dev) else NATIVE)


class _Tally:
    """Profiled calls summed into their op's row, the window's totals and their user line's time."""

    def __init__(self, out: Profiled, locator: Locator) -> None:
        self.out, self.locator = out, locator
        self.rows: dict[tuple[str, str], ProfiledOp] = {}
        self.row_sites: dict[tuple[str, str], dict[tuple[str, int], LineTime]] = {}
        self.lines: dict[tuple[str, int], LineTime] = {}
        self.sites: dict[tuple[str, int], Site] = {}

    def add(self, name: str, kind: str, shapes: tuple, dtypes: tuple, where: tuple[str, int] | None, device_ns: int,
            host_ns: int) -> None:
        out, key = self.out, (name, kind)
        row = self.rows.get(key)
        if row is None:
            row = self.rows[key] = ProfiledOp(name, kind, shapes=shapes, dtypes=dtypes)
            self.row_sites[key] = {}
        row.calls += 1
        row.device_ns += device_ns
        row.host_ns += host_ns
        out.device_ns += device_ns
        out.host_ns += host_ns
        if where is None:
            row.unattributed += 1
            out.unattributed_ns += device_ns + host_ns
            return
        site = self.sites.get(where)
        if site is None:
            site = self.sites[where] = self.locator.site(*where)
        for table, into in ((self.row_sites[key], row.sites), (self.lines, None)):
            lt = table.get(where)
            if lt is None:
                lt = table[where] = LineTime(site)
                if into is not None:
                    into.append(lt)
            lt.calls += 1
            lt.device_ns += device_ns
            lt.host_ns += host_ns

    def finish(self) -> Profiled:
        """The rows and lines in the order the renderers show them: the most device + host time first."""
        for row in self.rows.values():
            row.sites.sort(key=lambda x: -x.total_ns)
        self.out.rows = sorted(self.rows.values(), key=lambda r: (-r.total_ns, r.op))
        self.out.lines = sorted(self.lines.values(), key=lambda x: -x.total_ns)
        return self.out


def _tally_ops(tally: _Tally, events: list[_Event], calls: _Calls, host_work: dict[int, str]) -> None:
    """Every profiled ATen op call, joined to the backend's call of it for its kind, shapes and line."""
    ops = {e.cid: e for e in events if not e.device and e.name.startswith("aten::") and id(e) not in host_work}
    owned = _owned(events, ops, host_work)
    owners = [ops[i] for i in owned]
    nested = _contained(owners)
    for name, profiled in _profiled_calls(ops, owners, calls).items():
        for op, call in zip(profiled, _paired(calls.by_name.get(name, []), profiled)):
            work = owned.get(op.cid, [])
            device_ns, host_ns = _op_ns(op, work, nested.get(op.cid, []))
            if call is not None:
                kind, shapes, dtypes, where = call
            else:
                kind, shapes, dtypes, where = _unreported_kind(work, host_work), op.shapes, (), None
            tally.add(name, kind, shapes, dtypes, where, device_ns, host_ns)


def _tally_collectives(tally: _Tally, events: list[_Event], calls: _Calls) -> None:
    """Collectives: device work of their own, no CPU op around them; the k-th to complete pairs with the k-th
    reported."""
    collectives: dict[str, list[_Event]] = {}
    for e in events:
        if e.device and e.name.startswith(COLLECTIVE_PREFIX):
            collectives.setdefault(e.name.partition(".")[0], []).append(e)
    for name, profiled in collectives.items():
        made = [c for c in calls.by_name.get(name, []) if c.kind == COLLECTIVE]
        for e, call in zip(sorted(profiled, key=lambda e: e.end), _paired(made, profiled)):
            shapes, dtypes, where = (call.shapes, call.dtypes, call.where) if call is not None else ((), (), None)
            tally.add(e.name, COLLECTIVE, shapes, dtypes, where, e.end - e.start, 0)


def _read(results: Any, calls: _Calls, baselines: dict[str, int]) -> Profiled:
    """Kineto's events and the backend's calls as report data: the timeline, then the time per op and per line."""
    events = _events(results)
    host_work = _host_work(events)
    timeline = _timeline(results, events, host_work, baselines)
    events = [e for e in events if e.name != MEMORY]
    tally = _Tally(Profiled(lanes=_lane_busy(events), timeline=timeline), calls.locator)
    _tally_ops(tally, events, calls, host_work)
    _tally_collectives(tally, events, calls)
    return tally.finish()


@contextmanager
def profile(*, export: str | None = None, row_limit: int = DEFAULT_ROW_LIMIT,
            locator: Locator | None = None) -> Iterator[Report]:
    """Run a block of a script under torch.profiler; the report (with ``report.profiled``) fills in when it exits.

    >>> with neuron_lab.profile(export="trace.json") as report:
    ...     loss = model(x).sum(); loss.backward()
    >>> print(report)  # ops by device + host time, time per line; the trace opens in https://ui.perfetto.dev
    """
    path = check_export_path(export) if export is not None else None
    check_row_limit(row_limit)
    locator = locator if locator is not None else FileLocator()
    p = OpProfile(locator, with_stack=path is not None, export=path).start()
    t = Tracker("profile", locator=locator).start()
    try:
        yield t.report
    except BaseException as e:
        t.attach_profile(p.result(export=path, row_limit=row_limit))
        p.keep(t.report)
        t.stop(e)
        raise
    t.attach_profile(p.result(export=path, row_limit=row_limit))
    p.keep(t.report)
    t.stop()
