"""A window of observation: start, run anything, stop, get a :class:`~neuron_lab.report.model.Report`.

The notebook session opens one per cell; ``neuron_lab.track()`` opens one around a block of a
script or test. Memory is read once at each end, after one synchronize; nothing else touches
the device. The tracker is the one writer of its report: the session tells it where the window ran, which checks
it made, what the profiler saw (:meth:`Tracker.attach_profile`) and what filled the device when it ran out
(:meth:`Tracker.note_oom`); :meth:`Tracker.stop` asks the site maps how to name the user lines (a nested cell's
lines as the outer cell's, a script's lines and title), applies them, and freezes the report before anybody else
sees it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from neuron_lab import backend as _backend
from neuron_lab.backend.coverage import rewrites
from neuron_lab.backend.interface import device_index
from neuron_lab.backend.memory_reading import MemoryReading
from neuron_lab.kinds import OFF_DEVICE, REPORTED
from neuron_lab.report.model import HandledOom, Memory, OpRow, OutOfMemory, Profiled, Report, Site
from neuron_lab.trace.compiles import CompileTrace, with_account
from neuron_lab.trace.ops import OpTrace
from neuron_lab.trace.reconcile import reconcile
from neuron_lab.trace.rss import rss
from neuron_lab.trace.sites import FileLocator, Locator


@dataclass(frozen=True)
class Renaming:
    """How a finished window names its user lines: what a site map answers, for :meth:`Tracker.stop` to apply."""

    site: Callable[[Site], Site]  # each user line (op call sites, graph breaks, recompiles, profiled lines)
    frame: Callable[[str], str] | None = None  # each formatted stack frame
    title: str | None = None  # the report's title, when the renaming gives it one ("train.py:12")


SiteMap = Callable[[Report], Renaming | None]  # given the finished report (read only): how to rename its lines


class Tracker:
    """Observes the active backend and dynamo between :meth:`start` and :meth:`stop`."""

    def __init__(self, title: str = "track", *, cell: int | None = None, device: str = "neuron:0",
                 mode: str = "default", locator: Locator | None = None, callsites: bool = True,
                 stack_limit: int = 3, stack_depth: int = 8, detail: str = "table") -> None:
        self.backend = _backend.active()
        locator = locator if locator is not None else FileLocator()
        coverage = self.backend.coverage
        self.report = Report.opened(title, cell, device, mode, self.backend.description, callsites=callsites,
                                    detail=detail, coverage=coverage.label if coverage is not None else None)
        self._ops = OpTrace(locator if callsites else None, stack_limit=stack_limit, stack_depth=stack_depth)
        self._compiles = CompileTrace(locator, self.backend.lowering_us, self.backend.dynamo_metrics)
        self._locator = locator
        self._ooms: list[tuple[int, Site | None, int | None, int | None]] = []  # (id of the error, line, asked, free)
        self._unwatch_ooms: Callable[[], None] = lambda: None
        self._unsubscribe = None
        self._running = False
        self._excluded_calls = 0
        self._excluded_transfers = (0, 0)

    @contextmanager
    def excluded(self) -> Iterator[None]:
        """Work inside the block is not the window's (rendering a cell's value or traceback, a check's copies and
        comparisons). A block inside another is the outer one's: its calls are set aside once."""
        if not self._running or self._ops.paused:
            yield
            return
        b = self.backend
        calls, (h2d, d2h) = b.op_calls(), b.transfer_totals()
        b.flush_ops()  # the calls counted by line so far are the window's; those the block makes are not
        self._ops.paused += 1
        try:
            yield
        finally:
            b.flush_ops(keep=False)
            self._ops.paused -= 1
            h2d2, d2h2 = b.transfer_totals()
            self._excluded_calls += b.op_calls() - calls
            eh, ed = self._excluded_transfers
            self._excluded_transfers = (eh + max(h2d2 - h2d, 0), ed + max(d2h2 - d2h, 0))

    def live(self) -> tuple[int, int, int, float]:
        """(CPU fallback calls, device-to-host syncs, ops, seconds) so far: plain counter reads, safe from any
        thread."""
        if not self._running:
            return self._ops.fallback_calls, self._ops.sync_calls, self.report.ops, self.report.wall_s
        self.backend.flush_ops()
        return (self._ops.fallback_calls, self._ops.sync_calls,
                self.backend.op_calls() - self._calls_before - self._excluded_calls, time.perf_counter() - self._t0)

    def rows_so_far(self) -> list[OpRow]:
        """The window's op rows so far (fallbacks, host ops, downcasts), as copies: safe from any thread."""
        if self._running:
            self.backend.flush_ops()
        return [r for r in self._ops.rows(copies=True) if r.kind in REPORTED]

    def compiling(self) -> dict[str, Any] | None:
        """The compile in progress, for live views (the live strip, the Compiles tab); None when none runs.

        ``{"frame": the function dynamo is compiling ("PolarNet.__call__"), "graphs": graphs compiled so far in
        this window (this cell), "elapsed_s": seconds since that frame's compile started}``. Plain reads, safe
        from any thread: poll it at the views' refresh rate while the cell runs.
        """
        return self._compiles.compiling() if self._running else None

    def ran_on(self, device: str | None = None, mode: str | None = None) -> None:
        """The window's code runs on ``device`` and/or in ``mode`` (a ``%%neuron`` cell chooses them).

        A window already open on another device measures memory on the new one from here on: the cell's code has not
        run yet when a ``%%neuron`` cell or ``%neuron device`` moves it."""
        if device is not None and device != self.report.device and self._running:
            self.backend.close_peak_window(self._peak_window)
            self._open_memory(device)
        if device is not None:
            self.report.device = device
        if mode is not None:
            self.report.mode = mode

    def keep(self, check: Any) -> None:
        """A check made inside the window (``%%neuron parity``, ``neuron_lab.compare``) joins its report."""
        self.report.checks = [*self.report.checks, check]

    def attach_profile(self, profiled: Profiled) -> None:
        """What torch.profiler saw of the window (``%%neuron profile``, ``neuron_lab.profile()``, ``neuron-lab run
        --trace``) joins its report; before :meth:`stop`, so the site maps name its lines too."""
        self.report.profiled = profiled

    def _heard_oom(self, error: BaseException) -> None:
        """The device raised its out-of-memory error: the outermost user line running (the cell's own; the inner
        frames a core still has when it tells differ), what it asked, what was free. Only facts are kept, never
        the error (its frames hold device memory)."""
        b = self.backend
        frame, user = sys._getframe(1), None
        while frame is not None:
            user = frame if self._locator.is_user_code(frame.f_code) else user
            frame = frame.f_back
        site = None if user is None else self._locator.site(user.f_code.co_filename, user.f_lineno)
        capacity = b.capacity()
        free = None if capacity is None else max(capacity - b.memory_reading(synchronize=False).reserved, 0)
        self._ooms.append((id(error), site, b.oom_asked(error), free))

    def _handled_ooms(self, error: BaseException | None, ooms_after: int) -> list[HandledOom]:
        """The out-of-memory errors heard in the window but the one it ended with, by line; those the device counted
        (``num_ooms``) but nobody heard, as one row without a line."""
        # Never str() another error here: its message may hold a device tensor, whose repr runs ops in the window.
        propagated = isinstance(error, torch.OutOfMemoryError) or (
            isinstance(error, RuntimeError) and bool(error.args) and isinstance(error.args[0], str)
            and self.backend.oom_asked(error) is not None)
        handled = [o for o in self._ooms if o[0] != id(error)]
        by_site: dict[Site | None, list] = {}
        for o in handled:
            by_site.setdefault(o[1], []).append(o)
        rows = [HandledOom(site, len(os), os[0][2], os[0][3]) for site, os in by_site.items()]
        propagated_unheard = int(propagated and len(handled) == len(self._ooms))
        unheard = ooms_after - self._ooms_before - len(self._ooms) - propagated_unheard
        return rows + ([HandledOom(None, unheard)] if unheard > 0 else [])

    def note_oom(self, oom: OutOfMemory) -> None:
        """The window ended with the device's out-of-memory error: what held the device, and what was given back."""
        self.report.oom = oom

    @property
    def memory_before(self) -> int:
        return self._mem_before

    def _open_memory(self, device: str) -> MemoryReading:
        """Baseline and peak window on the window's device (the notebook's, not the current one); the reading. The
        device's index is read once, for every reading of the window."""
        self._index = device_index(device)
        reading = self.backend.memory_reading(self._index, synchronize=False)  # the last window synced
        self._mem_before = reading.allocated
        self._peak_window = self.backend.open_peak_window(self._index)  # the emulator leaves the user's peak alone
        return reading

    def start(self) -> Tracker:
        b = self.backend
        reading = self._open_memory(self.report.device)
        self._rss_before = rss()
        self._calls_before = b.op_calls()
        self._transfers_before = b.transfer_totals()
        watched = b.begin_window()  # the device's own account of the window starts here (TorchNeuron: cleared)
        self._ooms_before = reading.ooms
        self._unwatch_ooms = b.watch_ooms(self._heard_oom)
        self._unsubscribe = b.subscribe(self._ops.record, REPORTED | watched, self._ops.role)
        try:
            self._compiles.start()
        except BaseException:  # a Ctrl-C that lands here leaves no compile window open (dynamo's log filters)
            self._compiles.stop()
            raise
        self._running = True
        self._t0 = time.perf_counter()
        return self

    def stop(self, error: BaseException | None = None, *, cell: int | None = None,
             site_maps: Sequence[SiteMap] = ()) -> Report:
        """Close the window and freeze its report; idempotent. ``error`` is what the window raised, if anything;
        ``cell`` is the notebook cell it was (it titles the report); ``site_maps`` say how to rename its user lines,
        each in turn on what the ones before made of them."""
        if not self._running:
            return self.report
        wall = time.perf_counter() - self._t0
        self._running = False
        b = self.backend
        self._unsubscribe()
        self._unwatch_ooms()
        r = self.report
        compiles = self._compiles.stop()
        reading = b.memory_reading(self._index)  # the one synchronize
        after = reading.allocated
        ooms_handled = self._handled_ooms(error, reading.ooms)
        peak = b.close_peak_window(self._peak_window)
        memory = Memory(self._mem_before, after, max(peak, after, self._mem_before), b.capacity(),
                        rss() - self._rss_before)
        ops = b.op_calls() - self._calls_before - self._excluded_calls
        h2d, d2h = b.transfer_totals()
        account = b.end_window()  # after the synchronize: what the device itself says about the window
        rows = reconcile(self._ops.rows(ordered=False), account)  # it orders them
        for row in rows:
            if row.kind in OFF_DEVICE:
                row.rewrite = rewrites.for_op(row.op, b.coverage)
        r.write(ooms_handled=ooms_handled, memory=memory, wall_s=wall, ops=ops,
                h2d_bytes=max(h2d - self._transfers_before[0] - self._excluded_transfers[0], 0),
                d2h_bytes=max(d2h - self._transfers_before[1] - self._excluded_transfers[1], 0),
                ops_not_native=rows, compiles=with_account(compiles, account))
        if error is not None:  # formatted last: str() of an exception may format tensors (device work)
            text = str(error).strip().split("\n")[0]
            text = text if len(text) <= 200 else text[:199] + "…"
            r.error = f"{type(error).__name__}: {text}".rstrip(": ")
        if cell is not None:
            r.write(cell=cell, title=f"In[{cell}]")
        for site_map in site_maps:
            renaming = site_map(r)
            if renaming is not None:
                r.map_sites(renaming.site, renaming.frame)
                r.title = renaming.title or r.title
        r.freeze()
        return r


@contextmanager
def track(*, callsites: bool = True, stack_limit: int = 3, locator: Locator | None = None) -> Iterator[Report]:
    """Observe a block of a script or test; the report fills in when the block exits.

    >>> with neuron_lab.track() as report:
    ...     model(x)
    >>> print(report); report.fallbacks
    """
    t = Tracker(locator=locator, callsites=callsites, stack_limit=stack_limit).start()
    try:
        yield t.report
    except BaseException as e:
        t.stop(e)
        raise
    else:
        t.stop()
