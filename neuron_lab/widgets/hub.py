"""One hub per session: the open views, the refresh thread, and the cell hooks that feed them.

A view either follows the session (the dashboard, a view asked for ``--live``) or is a snapshot: it shows the
state at the end of the cell that opened it and stays so, so a notebook read top to bottom (or run with Run
All) shows each cell's own state. A refresh is plain counter reads (``backend.memory_sample``, the tracker's
counts; the memory timeline's samples are the session's own) and a copy of the running cell's op rows; the
thread only assigns widget traits, which ipykernel sends as comm messages from any thread. It never prints or
displays, and it exists only while a view is being updated. What the views do inside a user's cell (opening a
view, the strip at a cell's start) is the hub's work, not the cell's: it runs outside the cell's report
(``Tracker.excluded``). At each cell's end the hub also updates the displays of the views it refreshed, so the
static snapshot beside each widget (what an export or an untrusted notebook shows) is its last state. While ranks are
started (``%neuron ranks``), every refresh also asks the ranks for their own counters (``session.rank_pulse``), so
the views show a row per rank, on whatever host it runs.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from neuron_lab.widgets import snapshot

MAX_STATIC = 16


class Hub:
    def __init__(self, session: Any) -> None:
        self.session = session
        self.panels: weakref.WeakSet = weakref.WeakSet()  # the views still updated: followers, this cell's snapshots
        self.made: weakref.WeakSet = weakref.WeakSet()  # every widget view, snapshots included (closed with the hub)
        self.static: list[Any] = []  # StaticViews still updated after a cell (newest MAX_STATIC kept)
        self.strips: list[tuple[Any, Any]] = []  # (panel, display handle) of this cell's auto-dashboard strip
        self.error: BaseException | None = None  # the refresh thread's last failure (it never prints)
        self._free_pending = False
        self._free_clicked: weakref.WeakSet = weakref.WeakSet()  # the views whose Free button waits
        self._lock = threading.Lock()  # guards ``panels``: the thread iterates while cells open views
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ranks: Any = None  # the rank_pulse.Listener of the newest ranks seen (kept after they stop: "stopped")
        session.starting.append(self._cell_started)
        session.listeners.append(self._cell_done)

    # -- views ----------------------------------------------------------------------------------
    def show(self, views: list[str], *, follow: bool = True) -> Any:
        """A widget where the frontend has widgets, else a static view. ``follow``: updated after every cell
        (and, as a widget, while cells run); otherwise a snapshot, last updated when the running cell ends."""
        if _frontend(self.session) == "widget":
            return self.open(views, follow=follow)
        from neuron_lab.widgets.static import StaticView

        with self._aside():
            view = StaticView(self, views, follow=follow)
        if follow or self.session.running is not None:
            self.static = [*self.static, view][-MAX_STATIC:]
        return view

    def open(self, views: list[str], *, follow: bool = True) -> Any:
        with self._aside():
            return self._open(views, follow=follow)

    def _open(self, views: list[str], *, follow: bool = True) -> Any:
        from neuron_lab.widgets.panel import Panel

        panel = Panel(self, views, follow=follow)
        self.made.add(panel)
        panel.refresh()
        if follow or self.session.running is not None:  # a snapshot outside a cell is final at once
            with self._lock:
                self.panels.add(panel)
            self._ensure_thread()
        return panel

    @contextmanager
    def _aside(self) -> Iterator[None]:
        """The views' own work on the main thread: inside a cell, the cell's report leaves it out."""
        tracker = self.session.running
        if tracker is None:
            yield
            return
        with tracker.excluded():
            yield

    def remove(self, panel: Any) -> None:
        with self._lock:
            self.panels.discard(panel)

    def open_panels(self) -> list[Any]:
        with self._lock:
            return list(self.panels)

    def refresh(self) -> None:
        for p in self.open_panels():
            p.refresh()

    def free(self, clicked: Any = None) -> None:
        """What the memory view's button does: ``%neuron free``, then fresh data in the following views and in
        the view ``clicked`` (a snapshot's button shows what it did).

        It clears frames and collects garbage, so it runs only on the main thread between cells; a click
        delivered elsewhere (a kernel subshell, while a cell runs) waits for the end of the running or next cell.
        """
        if clicked is not None:
            self._free_clicked.add(clicked)
        if threading.current_thread() is not threading.main_thread() or self.session.running is not None:
            self._free_pending = True
            return
        self._free_pending = False
        text = str(self.session.free())
        shown = {*self.open_panels(), *self._free_clicked}
        self._free_clicked = weakref.WeakSet()
        for p in shown:
            p.freed = text
            p.refresh()

    # -- cell hooks (main thread) -----------------------------------------------------------------
    def _cell_started(self, session: Any) -> None:
        with self._aside():
            panels = self.open_panels()
            live = self.live() if panels else None
            for p in panels:
                p.set_live(live)
            if session.config.auto_dashboard and _frontend(session) == "widget":
                strip = self._open([snapshot.STRIP])
                self.strips.append((strip, strip.display()))

    def _cell_done(self, report: Any) -> None:
        if self._free_pending:
            self.free()  # refreshes too
        else:
            self.refresh()
        strips = {id(strip) for strip, _ in self.strips}
        for p in self.open_panels():  # the snapshot beside each widget: this cell's end, as the saved notebook keeps it
            if id(p) not in strips:
                p.update_displays()
        with self._lock:  # this cell's snapshots are final now
            self.panels = weakref.WeakSet(p for p in self.panels if p.follow)
        for view in self.static:
            view.update()
        self.static = [v for v in self.static if v.follow]
        strips, self.strips = self.strips, []
        if strips:
            from IPython.display import HTML

            from neuron_lab.widgets import static

            for strip, handle in strips:  # the cell's record: the final values, as HTML that outlives the widget
                if handle is not None:
                    handle.update(HTML(static.render_html(strip.data, strip.live, strip.views)))
                strip.close()

    # -- the refresh thread -----------------------------------------------------------------------
    def _ensure_thread(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="neuron_lab-widgets", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0 / self.session.config.widget_refresh_hz):
            if not self.open_panels():
                self._thread = None
                return
            try:
                self.tick()
            except Exception as e:  # noqa: BLE001  (a thread must not print; keep it for inspection)
                self.error = e

    def tick(self) -> None:
        """One live update: only while a cell runs (between cells nothing moves)."""
        if self.session.running is None:
            return
        live = self.live()
        for p in self.open_panels():
            p.set_live(live)

    def live(self, *, settle: bool = False) -> dict[str, Any]:
        """:func:`snapshot.live`, with a row per rank while ranks are started (and after they stop, as stopped):
        their own counters, asked of them (``session.rank_pulse``); ``settle``: each rank's answer after the cell."""
        live = snapshot.live(self.session)
        group = self.session.ranks
        if group is not None and not group.stopped and (self._ranks is None or self._ranks.group is not group):
            from neuron_lab.session.rank_pulse import Listener

            self._ranks = Listener(group)
        if self._ranks is not None:
            live["ranks"] = snapshot.ranks(self._ranks.rows(settle))
        return live

    def close(self) -> None:
        """Unload: stop the thread, close every view, unhook from the session (a later ``hub_of`` makes a new hub)."""
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=5)
        self._thread = None
        for p in list(self.made):
            p.close()
        self.static.clear()
        for fn, hooks in ((self._cell_started, self.session.starting), (self._cell_done, self.session.listeners)):
            if fn in hooks:
                hooks.remove(fn)
        if self.session.views is self:
            self.session.views = None


def _frontend(session: Any) -> str:
    """``widget`` under a kernel, ``static`` in a terminal; ``NeuronLab.display_as`` overrides."""
    how = session.config.display_as
    if how != "auto":
        return how
    return "widget" if getattr(session.shell, "kernel", None) is not None else "static"
