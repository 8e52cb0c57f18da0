"""Per-window rows for the ops that did not run natively, each with the user lines that issued it (and the
innermost library line between, when a library issued it).

Only the reported kinds (fallback, host, downcast, sync, ...) are delivered here (native ops are counted by the
backend), so the cost is on calls that are already slow. Looking up the site is a walk up the
frame chain with a per-code-object cache (a few microseconds); the full stack is formatted only
for the first ``stack_limit`` calls of each (op, site), so a training loop pays for stacks a
bounded number of times while every call is still counted at its line.
"""

from __future__ import annotations

import copy
import sys
import threading

from neuron_lab import kinds
from neuron_lab.backend.events import OpEvent
from neuron_lab.report.model import OpRow, SiteCount
from neuron_lab.trace.sites import Locator


class OpTrace:
    """Collects :class:`OpRow`s from the backend's op events."""

    def __init__(self, locator: Locator | None, stack_limit: int = 3, stack_depth: int = 8) -> None:
        self.locator = locator  # None: call sites off
        self.stack_limit = stack_limit
        self.stack_depth = stack_depth
        self._lock = threading.Lock()
        self._rows: dict[tuple[str, str, int], OpRow] = {}  # (op, kind, group size): a collective per group size
        self._sites: dict[tuple[str, str, int], dict[tuple, SiteCount]] = {}  # (file, line, library line)
        self.paused = 0  # > 0 while work that is not the user's runs (formatting a value for display)
        self.fallback_calls = 0  # CPU fallback and host calls so far: live views read it from their thread
        self.sync_calls = 0  # device-to-host syncs so far, read the same way

    def __call__(self, event: OpEvent, args: tuple, kwargs: dict) -> None:
        if self.paused:
            return
        key = (event.qualified_name, event.kind, event.ranks)
        with self._lock:
            row = self._rows.get(key)
            if row is None:
                row = self._rows[key] = OpRow(event.qualified_name, event.kind, event.reason,
                                              shapes=event.shapes, dtypes=event.dtypes, ranks=event.ranks)
                self._sites[key] = {}
            row.count += 1
            row.host_ns += event.host_ns
            row.nbytes += event.nbytes
            if event.kind in kinds.OFF_DEVICE:
                self.fallback_calls += 1
            elif event.kind == kinds.SYNC:
                self.sync_calls += 1
            if self.locator is None:
                row.unattributed += 1
                return
        frame = sys._getframe(1)
        user, library = self.locator.frames(frame)
        with self._lock:
            if user is None:
                row.unattributed += 1
                return
            sites = self._sites[key]
            via = None if library is None else (library.f_code.co_filename, library.f_lineno)
            where = (user.f_code.co_filename, user.f_lineno, via)
            sc = sites.get(where)
            if sc is None:
                sc = sites[where] = SiteCount(self.locator.site(*where[:2]),
                                              via=None if via is None else self.locator.site(*via))
                row.sites.append(sc)
            sc.count += 1
            want_stack = sc.count <= self.stack_limit
        if want_stack:
            stack = self.locator.stack(frame, self.stack_depth)
            with self._lock:
                if stack not in sc.stacks:
                    sc.stacks.append(stack)

    def rows(self, *, copies: bool = False) -> list[OpRow]:
        """In report order (:func:`neuron_lab.kinds.row_order`); sites by count. ``copies``: copied under the lock,
        for another thread (a live view) to read while calls go on."""
        with self._lock:
            rows = [copy.deepcopy(r) for r in self._rows.values()] if copies else list(self._rows.values())
            for r in rows:
                r.sites.sort(key=lambda s: (-s.count, s.site.cell or 0, s.site.line))
        return sorted(rows, key=kinds.row_order)
