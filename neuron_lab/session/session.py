"""Per-shell state: the notebook device, the default mode, one tracker per cell, the report history,
and what is attached to the shell for it (the out-of-memory hook, live views, rank engines).

It hooks IPython's ``pre_run_cell``/``post_run_cell`` (not ``*_execute``, which also fire for
widget and comm traffic), counts nesting so a ``run_cell`` inside a cell (``%%capture``) stays part
of the outer cell, and hands each finished :class:`Report` to its listeners (the extension shows
it, the widgets refresh, ``neuron-lab run``'s kernel side sends it back). Reports hold no tensors,
so history never keeps device memory alive.
"""

from __future__ import annotations

import sys
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, replace
from typing import Any

import torch

from neuron_lab import backend as _backend
from neuron_lab import interrupts, modes
from neuron_lab.compat import ipython
from neuron_lab.kinds import FALLBACK, KINDS, POSSIBLE
from neuron_lab.report.model import Report
from neuron_lab.session import devices, free, oom
from neuron_lab.session.cells import CellLocator, run_body
from neuron_lab.session.config import NeuronLab
from neuron_lab.session.notes import OnceNotes
from neuron_lab.session.oom import OomHandler
from neuron_lab.session.waits import CompileProgress
from neuron_lab.trace import compile_errors
from neuron_lab.trace.sampler import MemorySampler
from neuron_lab.trace.timeline import Timeline
from neuron_lab.trace.tracker import Renaming, SiteMap, Tracker
from neuron_lab.units import ShownAsText, count, format_capacity, format_size


@dataclass
class Totals:
    cells: int = 0
    fallback_calls: int = 0
    possible_calls: int = 0  # calls that may fall back on TorchNeuron (kinds.POSSIBLE), counted apart
    compiles: int = 0
    graph_breaks: int = 0
    recompiles: int = 0


@dataclass(frozen=True)
class CellToCheck:
    """A ``%%neuron parity`` / ``compare`` cell as the session sees it: plain data, so the session never imports the
    checks (they sit above it); :meth:`Session.cell_to_check` makes one, ``neuron_lab.checks.run_check`` runs it."""

    shell: Any
    body: str  # the cell's body, below the magic line
    raw_cell: str  # the whole cell as typed: line numbers and tracebacks are its own
    number: int  # the cell's execution count
    hidden: frozenset[str]  # IPython's own names in the namespace
    device_variable: str  # the variable naming the notebook device
    device: torch.device  # the notebook device: the device under test
    locator: CellLocator
    exclude: Callable[[], AbstractContextManager] = nullcontext  # work that is not the cell's (the open tracker's)
    keep: Callable[[Any], None] | None = None  # the check's result joins the open cell's report


class Session:
    def __init__(self, shell: Any, config: NeuronLab) -> None:
        self.shell = shell
        self.config = config
        self.locator = CellLocator(shell)
        self.mode = modes.DEFAULT
        self.compile_options = modes.CompileOptions(config.compile_backend)
        self.history: OrderedDict[int, Report] = OrderedDict()
        self.totals = Totals()
        self.listeners: list[Callable[[Report], None]] = []  # called with each finished cell's report
        self.notes = OnceNotes()  # the notes said once a session under a report (the int64 note)
        self.rank_windows: list[Callable[[Any], None]] = []  # called with each `%%neuron ranks` window (RanksReport)
        self.site_maps: list[SiteMap] = [self._as_outer_cell]  # applied to each report before any listener
        self.starting: list[Callable[[Session], None]] = []  # called as each cell starts
        self.finishing: list[Callable[[Tracker], None]] = []  # called as each cell ends, before its report is made
        self.timeline = Timeline()
        self.sampler = MemorySampler(self.timeline)  # the timeline's samples while a cell runs
        self.progress = CompileProgress(shell)  # a long compile's line in its cell
        self.views: Any = None  # the live views' hub, attached by neuron_lab.widgets; closed with the session
        self.ranks: Any = None  # the engines of `%neuron ranks start N` (session.ranks.Ranks); stopped with it
        self._cell_start_s = 0.0
        self._compiled_before: int | None = None
        self._depth = 0
        self._outer_at = 0  # how deep the outermost cell's pre_run_cell ran: a nested cell's runs deeper
        self._tracker: Tracker | None = None
        self._cell_modes: ExitStack | None = None
        self._raw_cell = ""
        self._nested: dict[str, int] = {}  # code name of a nested run_cell -> its line offset in the outer cell
        self._default_set = False  # `%neuron device --default` set torch's default device ...
        self._default_device_before: torch.device | None = None  # ... and this gives it back
        self._oom = OomHandler(shell, config)
        self.device = self._initial_device()

    # -- lifecycle ------------------------------------------------------------------------------
    def _initial_device(self) -> torch.device:
        current = self.shell.user_ns.get(self.config.device_variable)
        if isinstance(current, torch.device):
            return current
        dev = torch.device("neuron", 0) if _backend.is_active() else torch.device("cpu")
        if current is None:
            self.shell.user_ns[self.config.device_variable] = dev
        return dev

    def start(self) -> None:
        self.config.observe(self._device_variable_renamed, names="device_variable")
        self.config.observe(self._apply_compile_lowering, names="compile_lowering")
        self._apply_compile_lowering()
        self.shell.events.register("pre_run_cell", self.pre_run_cell)
        self.shell.events.register("post_run_cell", self.post_run_cell)
        self._oom.install()
        # Formatting the cell's value or its traceback is IPython's work, not the cell's: a tensor's
        # repr runs reductions and copies that would otherwise show up at the cell's last line.
        self._excluding = []
        targets = [(self.shell.display_formatter, "format"), (self.shell, "showtraceback"),
                   *ipython.traceback_storage(self.shell)]  # IPython 9 keeps a formatted copy
        for obj, name in targets:
            if not hasattr(obj, name):
                continue
            original = getattr(obj, name)
            self._excluding.append((obj, name, name in obj.__dict__, original))
            setattr(obj, name, self._excluded(original, self._name_cells if name == "showtraceback" else None))

    def _excluded(self, fn: Callable, first: Callable | None = None) -> Callable:
        def run_outside_the_report(*args, **kwargs):
            if first is not None:
                first(*args, **kwargs)
            t = self._tracker
            if t is None:
                return fn(*args, **kwargs)
            with t.excluded():
                return fn(*args, **kwargs)

        run_outside_the_report.__neuron_lab_wraps__ = fn
        return run_outside_the_report

    def _name_cells(self, exc_tuple: tuple | None = None, *args: Any, **kwargs: Any) -> None:
        """Before IPython shows a traceback: a fullgraph graph break's message names the cells it lists as the
        traceback does (dynamo writes Jupyter's temporary file for a cell)."""
        error = exc_tuple[1] if exc_tuple else sys.exc_info()[1] or getattr(sys, "last_value", None)  # as IPython
        if error is not None and compile_errors.is_graph_break_error(error):
            compile_errors.name_cells(error, self.locator.cell_label)

    def _device_variable_renamed(self, change: dict) -> None:
        """``%config NeuronLab.device_variable = 'dev'``: the new name holds the notebook device from now on
        (the old one is left as it is: it is the user's variable now)."""
        self.shell.user_ns[change["new"]] = self.device

    def _apply_compile_lowering(self, change: dict | None = None) -> None:
        """``NeuronLab.compile_lowering`` reaches the backend through its interface; a backend whose compiler
        offers no choice is left alone at load, and says so when the setting is changed."""
        if not _backend.is_active():
            return
        b = _backend.active()
        if change is None and self.config.compile_lowering not in b.compile_lowerings:
            return
        try:
            b.set_compile_lowering(self.config.compile_lowering)
        except NotImplementedError as e:
            warnings.warn(str(e), UserWarning, stacklevel=2)

    def close(self) -> None:
        """Undo everything: views, events, an open cell (unloading from inside a cell), its modes, default device.

        Only this session's own modes are undone: another shell's (or an enclosing ``%%neuron`` body's) stay."""
        if self.views is not None:
            self.views.close()
            self.views = None
        self.sampler.close()
        self.progress.close()
        if self.ranks is not None:
            self.ranks.stop()
            self.ranks = None
        self.config.unobserve(self._device_variable_renamed, names="device_variable")
        self.config.unobserve(self._apply_compile_lowering, names="compile_lowering")
        if _backend.is_active() and _backend.active().compile_lowerings:
            _backend.active().set_compile_lowering(None)  # back to NEURON_LAB_COMPILE_LOWERING's choice
        for name, fn in (("pre_run_cell", self.pre_run_cell), ("post_run_cell", self.post_run_cell)):
            if fn in self.shell.events.callbacks[name]:
                self.shell.events.unregister(name, fn)
        for obj, name, was_own, original in getattr(self, "_excluding", []):
            if hasattr(obj.__dict__.get(name), "__neuron_lab_wraps__"):
                if was_own:
                    setattr(obj, name, original)
                else:
                    del obj.__dict__[name]  # the class's method shows through again
        self._excluding = []
        self._oom.uninstall()
        if self._cell_modes is not None:
            self._cell_modes.close()
            self._cell_modes = None
        if self._tracker is not None:
            self._tracker.stop()
            self._tracker = None
        modes.forget_compiled()
        if self._default_set:
            torch.set_default_device(self._default_device_before)
            self._default_set, self._default_device_before = False, None
        self.listeners.clear()
        self.rank_windows.clear()
        self.starting.clear()
        self.finishing.clear()

    # -- events ---------------------------------------------------------------------------------
    @interrupts.guard  # a Ctrl-C waits until the cell's tracker is started and kept, or never started
    def pre_run_cell(self, info: Any) -> None:
        here = _frames_below(sys._getframe())
        if self._depth and here <= self._outer_at:  # not nested: the last cell's post_run_cell was cut short
            self._drop_cell()
        if not self._depth:
            self._outer_at = here
        self._depth += 1
        if self._depth > 1:  # a run_cell inside a cell (%%capture): part of the outer one
            self._note_nested(getattr(info, "raw_cell", "") or "")
            return
        if not getattr(info, "store_history", True):
            return  # not a cell of the notebook's history (a frontend's scratch execution)
        try:
            self._raw_cell = getattr(info, "raw_cell", "") or ""
            stack = ExitStack()
            if self.mode != modes.DEFAULT:
                stack.enter_context(modes.mode(self.mode, self.compile_options))
            self._cell_modes = stack
            c = self.config
            self._tracker = Tracker("In[?]", cell=None, device=str(self.device), mode=self.mode,
                                    locator=self.locator, callsites=c.callsites, stack_limit=c.callsite_stacks,
                                    stack_depth=c.stack_depth, detail=c.report_detail).start()
            self._cell_start_s = self.timeline.now()
            self._compiled_before = self.locator.newest_cell()
            self.timeline.sample(self._tracker.memory_before, self._cell_start_s)
            self.progress.cell_started(self._tracker, c.compile_progress_s)
            if _backend.is_active():
                device, b = self.device, _backend.active()
                self.sampler.start(lambda: b.memory_sample(device), c.memory_sample_ms / 1000)
        except Exception as e:  # never break the user's cell
            self._tracker = None
            warnings.warn(f"neuron_lab could not start the cell report: {type(e).__name__}: {e}", RuntimeWarning,
                          stacklevel=1)
            return
        self._notify(self.starting, self)

    def _note_nested(self, raw: str) -> None:
        """Remember where a nested cell's code sits in the outer cell, to report its lines as the outer's.

        IPython names the nested code as another cell; the name is computed here the way IPython will.
        """
        outer = self._raw_cell
        at = outer.find(raw.rstrip("\n")) if raw.strip() else -1
        if at < 0:
            return
        try:
            name = self.shell.compile.get_code_name(raw, self.shell.transform_cell(raw), self.shell.execution_count)
        except Exception:
            return
        self._nested[name] = outer[:at].count("\n")

    def _as_outer_cell(self, report: Report) -> Renaming | None:
        """A site map: the lines of a nested cell's code are the outer cell's."""
        if not self._nested:
            return None
        nested = dict(self._nested)
        self._nested.clear()
        return Renaming(lambda site: site if site.filename not in nested
                        else replace(site, cell=report.cell, line=site.line + nested[site.filename]))

    def _drop_cell(self) -> None:
        """End a cell whose post_run_cell never ran (a Ctrl-C landed on its first bytecodes, before the guard):
        its tracker's windows close, with no report."""
        self._depth = 0
        if self._cell_modes is not None:
            self._cell_modes.close()
            self._cell_modes = None
        tracker, self._tracker = self._tracker, None
        if tracker is not None:
            self.sampler.stop()
            self.progress.cell_ended()
            tracker.stop()

    @interrupts.guard  # a Ctrl-C waits until the cell's tracker has stopped (its compile window closed)
    def post_run_cell(self, result: Any) -> None:
        self._depth = max(self._depth - 1, 0)
        if self._depth:
            return
        if self._cell_modes is not None:
            self._cell_modes.close()
            self._cell_modes = None
        tracker, self._tracker = self._tracker, None
        if tracker is None:
            return
        self.sampler.stop()
        self.progress.cell_ended()
        self._notify(self.finishing, tracker)
        error = getattr(result, "error_in_exec", None) or getattr(result, "error_before_exec", None)
        n = getattr(result, "execution_count", None)  # IPython 9 counts up before the cell, 8 after
        if oom.is_oom(error) and _backend.is_active():
            with tracker.excluded():  # before the report reads memory: it counts what the OOM gave back
                tracker.note_oom(self._oom.after(error))
        report = tracker.stop(error, cell=n, site_maps=self.site_maps)
        end_s = self.timeline.now()
        self.timeline.sample(report.memory.after, end_s)
        if report.touched_device:  # the timeline marks the cells that used the device
            self.timeline.mark_cell(n, self._cell_start_s, end_s)
        if oom.is_oom(error):  # the memory timeline marks where the device ran out
            self.timeline.mark("oom", end_s, f"out of memory in In[{n}]")
        self._keep(report)
        self._notify(self.listeners, report)

    def ranks_ran(self, window: Any) -> None:
        """A ``%%neuron ranks`` cell ran on the ranks: their window (``report.ranks.RanksReport``), failed or not, goes
        to its listeners before the cell's own report does (a headless run judges the ranks' reports with the cell)."""
        self._notify(self.rank_windows, window)

    @staticmethod
    def _notify(listeners: list[Callable], arg: Any) -> None:
        for fn in list(listeners):
            try:
                fn(arg)
            except Exception as e:
                warnings.warn(f"neuron_lab listener failed: {type(e).__name__}: {e}", RuntimeWarning, stacklevel=1)

    def running_cell(self) -> int | None:
        """The running cell's number once IPython has compiled it (None before, or between cells)."""
        n = self.locator.newest_cell()
        return n if self._tracker is not None and n is not None and n != self._compiled_before else None

    @property
    def running(self) -> Tracker | None:
        """The open cell's tracker while a cell runs (live views read its counters), else None."""
        return self._tracker

    def _keep(self, report: Report) -> None:
        """History holds the cells that touched the device: `%neuron report --last` is the last of those."""
        if not report.touched_device:
            return
        if report.cell is not None:
            self.history.pop(report.cell, None)
            self.history[report.cell] = report
        while len(self.history) > self.config.history_size:
            self.history.popitem(last=False)
        t = self.totals
        t.cells += 1
        t.fallback_calls += report.fallback_calls
        t.possible_calls += report.possible_calls
        t.compiles += report.compiles.frames
        t.graph_breaks += len(report.compiles.breaks)
        t.recompiles += len(report.compiles.recompiles)

    # -- device ---------------------------------------------------------------------------------
    def set_device(self, dev: torch.device, *, default: bool = False) -> None:
        self.device = dev
        self.shell.user_ns[self.config.device_variable] = dev
        if default:
            if not self._default_set:
                self._default_set, self._default_device_before = True, devices.default_device()
            torch.set_default_device(dev)
        if self._tracker is not None:
            self._tracker.ran_on(device=str(dev))

    @contextmanager
    def cell_device(self, dev: torch.device) -> Iterator[None]:
        """The cell runs with ``dev`` as the notebook device; the previous one comes back afterwards."""
        var = self.config.device_variable
        ns = self.shell.user_ns
        before, had = ns.get(var), var in ns
        before_device = self.device
        default_set = self._default_set
        default_before = devices.default_device()
        self.set_device(dev, default=default_set)
        try:
            yield
        finally:
            self.device = before_device
            if had:
                ns[var] = before
            else:
                ns.pop(var, None)
            if default_set:
                torch.set_default_device(default_before)
            if self._tracker is not None:
                self._tracker.ran_on(device=str(dev))  # the report says where the cell ran

    def move(self, names: list[str], dev: torch.device) -> devices.MoveReport:
        ns = self.shell.user_ns
        report = devices.move(ns, names, dev)
        report.stayed += devices.stayed_elsewhere(ns, dev, skip={*names, *self._hidden_names()})
        return report

    def variable_names(self) -> list[str]:
        """The user's own names in the namespace: not IPython's, not ``_private``."""
        hidden = self._hidden_names()
        return [n for n in self.shell.user_ns if n not in hidden and not n.startswith("_")]

    def movable_names(self) -> list[str]:
        return [n for n in self.variable_names() if devices.movable(self.shell.user_ns[n])]

    def _hidden_names(self) -> set[str]:
        return {*self.shell.user_ns_hidden, "In", "Out", "exit", "quit", "get_ipython"}

    # -- modes ----------------------------------------------------------------------------------
    def set_mode(self, mode: str, options: modes.CompileOptions | None = None) -> None:
        """The default for the cells that follow (the current cell keeps the mode it started with)."""
        self.mode = mode
        if options is not None:
            self.compile_options = options

    def _typed_cell(self, body: str, raw_cell: str) -> str:
        """A ``%%neuron`` cell as the user typed it: the running cell itself when it is the one whose body runs
        (IPython hands the magic its line and body apart), else ``raw_cell`` as the magic rebuilt it."""
        outer = self._raw_cell
        return outer if outer.lstrip().startswith("%%") and outer.rstrip().endswith(body.rstrip()) else raw_cell

    def run_cell_body(self, body: str, raw_cell: str, *, mode: str | None = None,
                      options: modes.CompileOptions | None = None, device: torch.device | None = None) -> Any:
        """Run a ``%%neuron`` body with a mode and/or device for this cell only."""
        __tracebackhide__ = True  # noqa: F841
        raw = self._typed_cell(body, raw_cell)
        # Ctrl-C stops the body at once, but waits while the mode and device are set and put back.
        with interrupts.guarded(), ExitStack() as stack:
            if device is not None:
                stack.enter_context(self.cell_device(device))
            if mode is not None:
                stack.enter_context(modes.mode(mode, options))
                if self._tracker is not None:
                    self._tracker.ran_on(mode=mode)
            number = self.locator.current_cell()
            try:
                return interrupts.user_code(run_body, self.shell, body, raw,
                                            self.shell.execution_count if number is None else number)
            except Exception as e:
                if compile_errors.is_graph_break_error(e):  # fullgraph: torch.compile's wrapper is no line of theirs
                    oom.end_in_user_code(e.__traceback__)
                raise

    def cell_to_check(self, body: str, raw_cell: str) -> CellToCheck:
        """The running ``%%neuron parity`` / ``compare`` cell, described for :func:`neuron_lab.checks.run_check`;
        a check made from it joins the cell's report (and the history)."""
        raw = self._typed_cell(body, raw_cell)
        number = self.locator.current_cell()
        t = self._tracker
        return CellToCheck(self.shell, body, raw, self.shell.execution_count if number is None else number,
                           frozenset(self._hidden_names()), self.config.device_variable, self.device, self.locator,
                           exclude=t.excluded if t is not None else nullcontext,
                           keep=t.keep if t is not None else None)

    # -- reports ----------------------------------------------------------------------------------
    def reset(self) -> None:
        self.history.clear()
        self.totals = Totals()
        self.timeline.clear()
        _backend.active().reset_peak_memory_stats(self.device)

    def free(self) -> free.FreeReport:
        return free.release(self.shell)

    def status(self) -> Status:
        return Status(self)


def banner(session: Session) -> str:
    """The line ``%load_ext neuron_lab`` prints: version, backend, device, capacity, mode."""
    from neuron_lab._version import __version__

    if not _backend.is_active():
        return f"neuron_lab {__version__}: no neuron backend ({_backend.state().reason}); device {session.device}"
    b = _backend.active()
    coverage = f", coverage {b.coverage.name}" if b.coverage else ""
    detail = f" · {b.detail}" if b.detail else ""
    return (f"neuron_lab {__version__}: {b.name} backend{coverage} · device {session.device} · "
            f"{_banner_capacity(b.capacity())} · mode {session.mode}{detail}")


def _banner_capacity(n: int | None) -> str:
    return format_capacity(n) if n is not None else f"capacity {format_capacity(n)}"


class Status(ShownAsText):
    """What ``%neuron status`` shows."""

    def __init__(self, s: Session) -> None:
        self.lines: list[str] = []
        d = _backend.state()
        if _backend.is_active():
            b = _backend.active()
            m = b.memory_reading(s.device)
            self.lines.append(f"backend: {b.description}")
            if b.differs_from_trainium:
                self.lines.append(f"differs: {b.differs_from_trainium}")
            self.lines.append(f"memory:  {format_size(m.allocated)} allocated on {s.device}, "
                              f"peak {format_size(m.peak)}, capacity {format_capacity(b.capacity())}")
            self.lines.append(f"         {format_size(m.reserved)} reserved, {format_size(m.active)} active, "
                              f"allocation retries {m.alloc_retries}, OOMs {m.ooms}")
            if b.peak_note:
                self.lines.append(f"         {b.peak_note}")
        else:
            self.lines.append(f"backend: none ({d.reason})")
        self.lines.append(f"device:  {s.device} (variable `{s.config.device_variable}`)")
        self.lines.append(f"mode:    {modes.described(s.mode, s.compile_options)}")
        t = s.totals
        self.lines.append(f"session: {count(t.cells, 'cell')} reported, "
                          f"{count(t.fallback_calls, KINDS[FALLBACK].call)}, "
                          f"{count(t.possible_calls, KINDS[POSSIBLE].call)}, {count(t.compiles, 'compile')}, "
                          f"{count(t.graph_breaks, 'graph break')}, {count(t.recompiles, 'recompile')}")

    def __str__(self) -> str:
        return "\n".join(self.lines)


def _frames_below(frame: Any) -> int:
    """How many frames call ``frame``: a run_cell inside a cell calls its hooks from deeper than the cell did."""
    n = -1
    while frame is not None:  # each frame's f_back read once
        frame, n = frame.f_back, n + 1
    return n
