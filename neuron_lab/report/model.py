"""The one data model of a tracked window (a notebook cell, or a ``neuron_lab.track()`` block).

Every renderer (plain text, HTML, JSON, the widgets) reads these objects and nothing else, so a
terminal, an exported notebook, a CI log and a widget show the same facts. The model holds names,
numbers and source text only: never a tensor, so keeping reports never keeps device memory alive.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import MISSING, FrozenInstanceError, asdict, dataclass, field, fields, is_dataclass, replace
from typing import Any, Protocol

from neuron_lab.backend.coverage.rewrites import Rewrite
from neuron_lab.deprecation import renamed
from neuron_lab.frames import shown_path
from neuron_lab.kinds import DOWNCAST, OFF_DEVICE, POSSIBLE, SECTION_OF, SOURCE, SYNC, Kind, sections
from neuron_lab.units import ShownAsText


@dataclass(frozen=True)
class Site:
    """A line of code: a notebook cell's, or a file's (the user's, or a library's such as ``modeling_t5.py``)."""

    filename: str
    line: int
    source: str  # the stripped source text of that line ("" when unknown)
    cell: int | None = None  # execution count of the notebook cell, when it is one

    @property
    def label(self) -> str:
        """``In[4] line 3``, or the file and line, an installed package's file from its package
        (``transformers/models/gpt2/modeling_gpt2.py:703``)."""
        if self.cell is not None:
            return f"In[{self.cell}] line {self.line}"
        return f"{shown_path(self.filename)}:{self.line}"

    @property
    def short_label(self) -> str:
        """``In[4] line 3``, or the file's folder and name and line (``gpt2/modeling_gpt2.py:703``,
        ``generation/utils.py:3280``: a name alone is often ``utils.py``)."""
        if self.cell is not None:
            return self.label
        folder, name = os.path.split(shown_path(self.filename))
        return f"{os.path.join(os.path.basename(folder), name)}:{self.line}"


@dataclass
class SiteCount:
    """How often one op came from one user line (through one library line), with the distinct stacks of its first
    captures."""

    site: Site
    count: int = 0
    stacks: list[tuple[str, ...]] = field(default_factory=list)  # "where in function: source", the user's line first
    via: Site | None = None  # the innermost library line between the op and the user's line (None: none)


@dataclass
class OpRow:
    """One op the report lists (a CPU fallback, a host op, a 64-bit downcast, an NKI kernel, a collective, ...)."""

    op: str  # "aten::atan2.out"
    kind: str  # a name of neuron_lab.kinds.KINDS
    reason: str
    count: int = 0
    host_ns: int = 0
    shapes: tuple[tuple[int, ...], ...] = ()  # of the first call
    dtypes: tuple[str, ...] = ()
    sites: list[SiteCount] = field(default_factory=list)
    unattributed: int = 0  # calls with no user line (call sites off, or no user frame on the stack)
    nbytes: int = 0  # a collective's payload, all calls together
    ranks: int = 0  # a collective's group size: a collective has a row per group size
    rewrite: Rewrite | None = None  # how to compute a fallback op from native ones, where the coverage allows one

    @property
    def why(self) -> str:
        """The reason in plain words, without its source."""
        return self.reason.partition(SOURCE)[0]

    @property
    def source(self) -> str:
        """Where the reason comes from (a GitHub issue, a compatibility table, a benchmark); "" when not given."""
        return self.reason.partition(SOURCE)[2]

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> OpRow:
        """The inverse of ``as_data(row)``: a row read back from JSON (a saved report, the widget's data)."""
        sites = [SiteCount(_site(sc["site"]), sc["count"], list(map(tuple, sc["stacks"])), _site(sc.get("via")))
                 for sc in d["sites"]]
        return cls(d["op"], d["kind"], d["reason"], d["count"], d["host_ns"], tuple(map(tuple, d["shapes"])),
                   tuple(d["dtypes"]), sites, d["unattributed"], d.get("nbytes", 0), d.get("ranks", 0),
                   _rewrite(d.get("rewrite")))


@dataclass
class Memory:
    """Device memory in bytes, read after one synchronize; host RSS delta in bytes."""

    before: int = 0
    after: int = 0
    peak: int = 0
    capacity: int | None = 0  # None: not known without starting the device's runtime (units.CAPACITY_UNKNOWN)
    host_rss_delta: int = 0

    @property
    def delta(self) -> int:
        return self.after - self.before


@dataclass(frozen=True)
class HeldTensor:
    """Device storages that one holder kept when the window ran out of device memory (views and the items of one
    list merged): what filled the device."""

    names: tuple[str, ...]  # "parts[…]", "model.fc.weight", "parts[…] in grow at In[5] line 4"
    shape: tuple[int, ...] | None  # of one storage
    dtype: str | None
    bytes: int  # all of them together
    storages: int
    held_by: str  # as neuron_lab.session.tensors names holders: "namespace", "IPython traceback", ...


@dataclass
class OutOfMemory(ShownAsText):
    """What held the device when the window ended with its out-of-memory error, and what was given back after.

    Shown on its own above the error's traceback (the short answer first), and again in the window's report."""

    allocated: int  # device bytes allocated once the error unwound
    tensors: list[HeldTensor] = field(default_factory=list)  # the biggest first
    more: int = 0  # bytes of the storages not listed
    freed: int = 0  # bytes the failing frames held, freed once the report was built (0 when they were kept)
    asked: int | None = None  # bytes the failed allocation asked for, where the device's error says it
    free: int | None = None  # bytes the device had free then (capacity less reserved), where its capacity is known

    def __str__(self) -> str:
        from neuron_lab.report.text import oom_text

        return "\n".join(oom_text(self))

    def _repr_html_(self) -> str:
        from neuron_lab.report.html import oom_block

        return oom_block(self)


@dataclass(frozen=True)
class HandledOom:
    """Out-of-memory errors the window's code caught and went on from (a retry with a smaller batch), by line."""

    site: Site | None  # the user's line the first one reached; None where the device does not say where
    count: int
    asked: int | None = None  # bytes the first one asked for, where the device's error says it
    free: int | None = None  # bytes the device had free then, where its capacity is known


@dataclass(frozen=True)
class GraphBreak:
    reason: str  # in plain words ("Python `if` on a tensor's value ...")
    site: Site | None  # the user's line: the break's own, or the one whose call reached it
    note: str = ""  # dynamo's own words, short ("generic_jump TensorVariable()")
    hint: str = ""  # how to avoid the break, dynamo's own hint where it gives one
    via: Site | None = None  # the library line where the graph broke, when it broke inside a library


@dataclass(frozen=True)
class Recompile:
    code: str  # the function that recompiled
    reason: str  # the guard that failed
    site: Site | None


@dataclass
class Compiles:
    """What torch.compile did in the window, from dynamo's own callbacks and metrics."""

    frames: int = 0  # frame compiles started (dynamo's compile callbacks)
    graphs: int = 0  # graphs handed to a backend
    compile_s: float = 0.0
    breaks: list[GraphBreak] = field(default_factory=list)
    recompiles: list[Recompile] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    # the device compiler's own time (TorchNeuron's neuronx-cc: NEFF compile, queued asynchronously, so outside
    # dynamo's window), apart from compile_s (tracing, passes, lowering)
    neff_compile_s: float = 0.0
    neff_cache: tuple[int, int] | None = None  # (hits, misses) of the NEFF cache in the window; None: not counted
    loading_s: float = 0.0  # of compile_s: loading the compiler (torch._dynamo), paid at a session's first compile;
    # of the cell's own time where imported_by names a library that loaded it in a window that compiled nothing
    imported_by: str = ""  # that library ("torch.optim": an optimizer's constructor imports dynamo)
    loading_rest: bool = False  # loading_s is only the backends' (AOTAutograd): dynamo itself loaded before

    def __bool__(self) -> bool:
        return bool(self.frames or self.graphs or self.breaks or self.recompiles or self.failures
                    or self.neff_compile_s or self.neff_cache)


@dataclass
class LineTime:
    """Profiled time of the op calls one user line issued (of one op, or of all ops at that line)."""

    site: Site
    calls: int = 0
    device_ns: int = 0  # on the device lanes (kernels, copies)
    host_ns: int = 0  # on the host, less the device time inside it (the emulator runs kernels on the calling thread)

    @property
    def total_ns(self) -> int:
        return self.device_ns + self.host_ns


@dataclass
class ProfiledOp:
    """One op of a profiled window (``%%neuron profile``, ``neuron_lab.profile()``): its calls and where they ran."""

    op: str  # "aten::addmm", as torch.profiler names it
    kind: str  # a name of neuron_lab.kinds.KINDS: "native", "fallback", ...
    calls: int = 0
    device_ns: int = 0
    host_ns: int = 0
    shapes: tuple[tuple[int, ...], ...] = ()  # of the first call
    dtypes: tuple[str, ...] = ()
    sites: list[LineTime] = field(default_factory=list)  # the lines that issued it, the most time first
    unattributed: int = 0  # calls with no user line on the stack

    @property
    def total_ns(self) -> int:
        return self.device_ns + self.host_ns


KERNEL = "kernel"  # a span of device work that computes
# device work that moves bytes between host and device ("Memcpy HtoD ..."): a timeline span's kind, and the kind of
# a profiled op the backend reported no call of whose device work is only copies (`.item()`)
COPY = "copy"
HOST_LANE = "host"  # the timeline lane of the host work of calls that ran off the device (CPU fallbacks)


@dataclass
class Span:
    """A stretch of one timeline lane: one profiled event, or several short neighbours of one kind merged into one
    (when the window had more events than a timeline keeps)."""

    start_ns: int  # from the window's start
    dur_ns: int
    name: str  # the op ("aten::addmm", "Memcpy HtoD (host -> neuron)"); the first one's when merged
    kind: str  # KERNEL, COPY, "collective", or the off-device kind of neuron_lab.kinds ("fallback", "host")
    events: int = 1  # profiled events it stands for
    busy_ns: int = 0  # their own time (less than dur_ns when merged events had gaps between them)


@dataclass
class Lane:
    """One row of the timeline: a device lane ("neuron:0") or :data:`HOST_LANE`, its spans in time order."""

    name: str
    spans: list[Span] = field(default_factory=list)


@dataclass
class MemoryCurve:
    """A device's allocated bytes over the window: the value at the window's start, then after each change."""

    device: str  # "neuron:0"
    points: list[tuple[int, int]] = field(default_factory=list)  # (ns from the window's start, bytes allocated)

    @property
    def peak(self) -> int:
        return max((b for _, b in self.points), default=0)


@dataclass
class ProfiledTimeline:
    """Where the window's time went, lane by lane, and its device memory: what the zoomable view draws. Bounded:
    past a cap, adjacent short spans merge (``merged`` counts the events that lost a span of their own)."""

    duration_ns: int = 0
    lanes: list[Lane] = field(default_factory=list)  # device lanes by name, then the host lane
    memory: list[MemoryCurve] = field(default_factory=list)  # one per device whose allocations were profiled
    events: int = 0  # profiled events on the lanes
    merged: int = 0  # of them, those drawn inside another one's span
    dropped: int = 0  # of them, those left out (the shortest) when merging alone could not meet the cap
    # where the window began on the profiler's clock, wall-clock ns since the epoch (Kineto's), which every process
    # on a machine shares: the windows of several ranks line up on it
    start_ns: int = 0

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ProfiledTimeline:
        lanes = [Lane(x["name"], [Span(**s) for s in x["spans"]]) for x in d["lanes"]]
        memory = [MemoryCurve(m["device"], [(t, b) for t, b in m["points"]]) for m in d["memory"]]
        return cls(d["duration_ns"], lanes, memory, d["events"], d["merged"], d["dropped"], d.get("start_ns", 0))


@dataclass
class Profiled:
    """What torch.profiler saw of a window, per op and per user line, with the device lanes' busy time."""

    rows: list[ProfiledOp] = field(default_factory=list)  # the most device + host time first
    lines: list[LineTime] = field(default_factory=list)  # the most device + host time first
    device_ns: int = 0  # all ops' device time
    host_ns: int = 0
    lanes: dict[str, int] = field(default_factory=dict)  # device lane ("neuron:0") -> ns it was busy
    unattributed_ns: int = 0  # device + host time of calls with no user line
    trace_path: str | None = None  # the exported Chrome/Perfetto trace, when one was written
    row_limit: int = 10  # rows the renderers show before folding the rest
    timeline: ProfiledTimeline = field(default_factory=ProfiledTimeline)
    # False where the device hands torch.profiler no events of its own (TorchNeuron): device times are then unknown,
    # not 0, and the device's profile is the files in artefacts_dir
    device_timing: bool = True
    artefacts_dir: str | None = None  # the folder the device wrote its own profile files into
    artefacts: list[str] = field(default_factory=list)  # those files, relative to artefacts_dir, sorted
    device_clock: str = "device"  # whose clock timed the device lanes: "host" where the backend runs them there
    lanes_note: str | None = None  # what the device lanes are, in the backend's words
    taken_over: bool = False  # a torch.profiler the window started took torch.profiler's session over and ended it

    @property
    def device_label(self) -> str:
        """The words every renderer labels this profile's device times with: "device", or "device (host clock)"
        where the backend's device kernels ran, and were timed, on the host."""
        return "device" if self.device_clock == "device" else f"device ({self.device_clock} clock)"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Profiled:
        """The inverse of ``asdict(profiled)``: read back from a saved report."""
        def line(x: dict[str, Any]) -> LineTime:
            return LineTime(_site(x["site"]), x["calls"], x["device_ns"], x["host_ns"])

        rows = [ProfiledOp(r["op"], r["kind"], r["calls"], r["device_ns"], r["host_ns"],
                           tuple(tuple(s) for s in r["shapes"]), tuple(r["dtypes"]), [line(x) for x in r["sites"]],
                           r["unattributed"]) for r in d["rows"]]
        return cls(rows, [line(x) for x in d["lines"]], d["device_ns"], d["host_ns"], dict(d["lanes"]),
                   d["unattributed_ns"], d["trace_path"], d["row_limit"],
                   ProfiledTimeline.from_dict(d["timeline"]) if "timeline" in d else ProfiledTimeline(),
                   d.get("device_timing", True), d.get("artefacts_dir"), list(d.get("artefacts", [])),
                   d.get("device_clock", "device"), d.get("lanes_note"), d.get("taken_over", False))


class Check(Protocol):
    """A trust check's result as a report carries it (``%%neuron parity`` / ``compare``): the classes of
    :mod:`neuron_lab.report.checks`, which sit above this model; the renderers tell them apart by their class."""

    @property
    def passed(self) -> bool: ...

    def as_dict(self) -> dict[str, Any]: ...


@dataclass
class Report(ShownAsText):
    """Everything one window did on the device.

    Its tracker is its one writer: once :meth:`~neuron_lab.trace.tracker.Tracker.stop` returns it, the report is
    final (:meth:`freeze`), and setting a field raises. A view that shows it otherwise is a copy
    (``dataclasses.replace(report, detail="full")``); a copy read back from data (:meth:`from_dict`) is its reader's.
    """

    title: str  # "In[7]" or "track"
    cell: int | None
    device: str  # the notebook device during the window ("neuron:0", "cpu")
    mode: str  # "default" | "eager" | "compile"
    backend: str  # the backend's description
    wall_s: float = 0.0
    ops: int = 0  # ops observed on the device
    h2d_bytes: int = 0
    d2h_bytes: int = 0
    memory: Memory = field(default_factory=Memory)
    ops_not_native: list[OpRow] = field(default_factory=list)
    compiles: Compiles = field(default_factory=Compiles)
    error: str | None = None  # "ZeroDivisionError: division by zero" when the window raised
    callsites: bool = True  # whether call sites were being captured
    detail: str = "table"  # how renderers show it: "summary" (one line), "table", "full" (with stacks)
    coverage: str | None = None  # the op coverage that classified the ops (None: the device reported them)
    checks: list[Check] = field(default_factory=list)  # %%neuron parity / compare results (report.checks)
    oom: OutOfMemory | None = None  # set when the window ended with the device's out-of-memory error
    ooms_handled: list[HandledOom] = field(default_factory=list)  # out-of-memory errors caught inside the window
    profiled: Profiled | None = None  # set by `%%neuron profile` / neuron_lab.profile(): torch.profiler's view
    _final = False  # a class attribute, not a field: True on a report its tracker has stopped

    @classmethod
    def opened(cls, *args: Any, **values: Any) -> Report:
        """A new report as its tracker opens it every cell, or as :meth:`from_dict` reads one back (16 per
        ``%%neuron ranks`` cell of 16 ranks): as ``Report(*args, **values)``, its fields set at once (the dataclass's
        ``__init__`` sets each through :meth:`__setattr__`, a Python call a field)."""
        r = object.__new__(cls)
        d = r.__dict__
        for name, default, factory in _FIELDS:
            d[name] = default if factory is MISSING else factory()
        d.update(zip(_NAMES, args))
        d.update(values)
        return r

    def write(self, **values: Any) -> None:
        """Set several fields at once (its tracker, as it stops); as setting each does, it raises once final."""
        if self._final:
            setattr(self, next(iter(values)), None)  # raises, saying why
        self.__dict__.update(values)

    def freeze(self) -> None:
        """The report is final: from now on setting a field raises ``FrozenInstanceError``."""
        object.__setattr__(self, "_final", True)

    def __setattr__(self, name: str, value: Any) -> None:
        if self._final:
            raise FrozenInstanceError(
                f"cannot set {name!r} of report {self.title}: it is final once its tracker stopped (the tracker is "
                "the one writer of its report: hand the tracker what belongs in it before stop, or make a copy "
                "with dataclasses.replace)")
        object.__setattr__(self, name, value)

    @property
    def profile(self) -> str | None:
        """Deprecated spelling of :attr:`coverage` (``profiled`` is torch.profiler's view)."""
        renamed("Report.profile", "Report.coverage")
        return self.coverage

    # -- the views renderers use ----------------------------------------------------------
    @property
    def fallbacks(self) -> list[OpRow]:
        """CPU fallbacks and host ops: what did not run on the device."""
        return [r for r in self.ops_not_native if r.kind in OFF_DEVICE]

    @property
    def downcasts(self) -> list[OpRow]:
        return [r for r in self.ops_not_native if r.kind == DOWNCAST]

    def sections(self) -> list[tuple[Kind, list[OpRow]]]:
        """The report's non-empty row sections, as :func:`neuron_lab.kinds.sections` groups them; a final report's
        are grouped once (its text, its HTML and their summary lines each ask)."""
        return list(self.kept("_sections", self._grouped))

    def _grouped(self) -> tuple[tuple[Kind, list[OpRow]], ...]:
        """The rows by section, in one pass over them."""
        grouped: dict[int, list[OpRow]] = {}
        for r in self.ops_not_native:
            at = SECTION_OF.get(r.kind)
            if at is not None:
                grouped.setdefault(at, []).append(r)
        table = sections()
        return tuple((table[at][0], grouped[at]) for at in sorted(grouped))

    def kept(self, name: str, make: Callable[[], Any]) -> Any:
        """A view of the report that ``make`` builds, kept under ``name`` once the report is final (its text and its
        HTML each ask for its summary line, its memory row and its sections); made afresh while it can change."""
        kept = self.__dict__.get(name)
        if kept is not None:
            return kept
        value = make()
        if self._final:
            object.__setattr__(self, name, value)
        return value

    @property
    def fallback_calls(self) -> int:
        return sum(r.count for r in self.fallbacks)

    @property
    def syncs(self) -> list[OpRow]:
        """The device-to-host reads the window forced, one row per reason, each with its lines."""
        return [r for r in self.ops_not_native if r.kind == SYNC]

    @property
    def sync_calls(self) -> int:
        return sum(r.count for r in self.syncs)

    @property
    def possible_calls(self) -> int:
        """Calls that may fall back on TorchNeuron (evidence short of its documentation), counted apart."""
        return sum(r.count for r in self.ops_not_native if r.kind == POSSIBLE)

    @property
    def run_s(self) -> float:
        """Wall time not spent compiling."""
        return max(self.wall_s - self.compiles.compile_s - self.compiles.neff_compile_s, 0.0)

    @property
    def touched_device(self) -> bool:
        return bool(self.ops or self.ops_not_native or self.compiles or self.h2d_bytes or self.d2h_bytes
                    or self.memory.delta or self.memory.peak > self.memory.before or self.profiled is not None
                    or self.oom is not None or self.ooms_handled)  # allocations the device refused (no op for it)

    def map_sites(self, site: Callable[[Site], Site], frame: Callable[[str], str] | None = None) -> None:
        """Rewrite every user line the report names (op call sites, graph breaks, recompiles) with ``site``,
        and each formatted stack frame with ``frame``: the one place a cell's lines become an outer cell's or a
        script's."""
        def fix(s: Site | None) -> Site | None:
            return None if s is None else site(s)

        for row in self.ops_not_native:
            for sc in row.sites:
                sc.site = site(sc.site)
                if frame is not None:
                    sc.stacks = [tuple(map(frame, st)) for st in sc.stacks]
        p = self.profiled
        if p is not None:
            for lt in [*p.lines, *(x for r in p.rows for x in r.sites)]:
                lt.site = site(lt.site)
        self.ooms_handled = [replace(h, site=fix(h.site)) for h in self.ooms_handled]
        c = self.compiles
        c.breaks = [replace(b, site=fix(b.site)) for b in c.breaks]
        c.recompiles = [replace(r, site=fix(r.site)) for r in c.recompiles]

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data (the JSON renderer)."""
        d = asdict(self)
        d["run_s"] = self.run_s
        d["fallback_calls"], d["possible_calls"] = self.fallback_calls, self.possible_calls
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Report:
        """The inverse of :meth:`as_dict` for everything but ``checks`` (their results stay data)."""
        rows = [OpRow.from_dict(r) for r in d["ops_not_native"]]
        c = d["compiles"]
        compiles = Compiles(c["frames"], c["graphs"], c["compile_s"],
                            [GraphBreak(b["reason"], _site(b["site"]), b.get("note", ""), b.get("hint", ""),
                                        _site(b.get("via")))
                             for b in c["breaks"]],
                            [Recompile(r["code"], r["reason"], _site(r["site"])) for r in c["recompiles"]],
                            list(c["failures"]), c.get("neff_compile_s", 0.0),
                            tuple(c["neff_cache"]) if c.get("neff_cache") else None, c.get("loading_s", 0.0),
                            c.get("imported_by", ""), c.get("loading_rest", False))
        oom = d.get("oom")
        if oom is not None:
            oom = OutOfMemory(oom["allocated"], [HeldTensor(tuple(t["names"]), None if t["shape"] is None
                                                            else tuple(t["shape"]), t["dtype"], t["bytes"],
                                                            t["storages"], t["held_by"]) for t in oom["tensors"]],
                              oom["more"], oom["freed"], oom.get("asked"), oom.get("free"))
        return cls.opened(d["title"], d["cell"], d["device"], d["mode"], d["backend"], d["wall_s"], d["ops"],
                          d["h2d_bytes"], d["d2h_bytes"], Memory(**d["memory"]), rows, compiles, d["error"],
                          d["callsites"], d["detail"], coverage=d.get("coverage", d.get("profile")), oom=oom,
                          profiled=Profiled.from_dict(d["profiled"]) if d.get("profiled") else None,
                          ooms_handled=[HandledOom(_site(h["site"]), h["count"], h["asked"], h["free"])
                                        for h in d.get("ooms_handled", [])])

    # -- IPython display protocol ---------------------------------------------------------
    def __str__(self) -> str:
        from neuron_lab.report.text import render_text

        return render_text(self)

    def _repr_html_(self) -> str:
        from neuron_lab.report.html import render_html

        return render_html(self)


_FIELDS = tuple((f.name, f.default, f.default_factory) for f in fields(Report))  # what Report.opened sets
_NAMES = tuple(f.name for f in fields(Report))


def _rewrite(d: dict[str, Any] | None) -> Rewrite | None:
    return None if d is None else Rewrite(**{**d, "uses": tuple(d["uses"])})


def _site(d: dict[str, Any] | None) -> Site | None:
    """A site read back, one object per line: the reports of a loop's cells, and of a cell's ranks, name the same
    lines (a Site is immutable, and looking one up costs less than making one: a frozen class's fields are set one
    Python call each)."""
    if d is None:
        return None
    key = (d["filename"], d["line"], d["source"], d.get("cell"))
    site = _SITES.get(key)
    if site is None:
        if len(_SITES) >= _SITES_KEPT:
            _SITES.clear()
        site = _SITES[key] = Site(*key)
    return site


_SITES: dict[tuple[str, int, str, int | None], Site] = {}  # read-back sites by their fields
_SITES_KEPT = 4096  # past it, the sites are made afresh


def as_data(obj: Any, *names: str) -> Any:
    """``obj`` as plain JSON data: a dataclass as a dict of its fields, tuples as lists (what a JSON round trip
    gives back); with ``names``, only those attributes of ``obj``, properties such as ``Report.run_s`` included.

    The widget's JSON is made of it, so it carries the model's own field names and nothing retyped.
    """
    if names:
        return {n: as_data(getattr(obj, n)) for n in names}
    if is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: as_data(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [as_data(x) for x in obj]
    if isinstance(obj, dict):
        return {k: as_data(v) for k, v in obj.items()}
    return obj
