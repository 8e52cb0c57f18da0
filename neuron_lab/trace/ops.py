"""Per-window rows for the ops that did not run natively, each with the user lines that issued it (and the
innermost library line between, when a library issued it).

Only the reported kinds (fallback, host, downcast, sync, ...) are delivered here (native ops are counted by the
backend), so the cost is on calls that are already slow. Looking up the site is a walk up the
frame chain with a per-code-object cache (a few microseconds); the full stack is formatted only
for the first ``stack_limit`` calls of each (op, site), so a training loop pays for stacks a
bounded number of times while every call is still counted at its line. :meth:`OpTrace.record` returns the line's
tally and how many of its next calls may still add a stack: a producer that walks frames itself (the compiled core,
given :attr:`OpTrace.role`) counts the line's further calls without calling Python, hands back only those of the next
calls whose frames differ from every call it handed over (a loop's calls repeat one stack), and hands the counts to the
tally when the backend is flushed.
"""

from __future__ import annotations

import copy
import sys
import threading
from collections.abc import Callable
from functools import partial
from types import CodeType

from neuron_lab import kinds
from neuron_lab.backend.events import USER, OpEvent, Roles, qualified
from neuron_lab.kinds import OFF_DEVICE, SYNC
from neuron_lab.report.model import OpRow, SiteCount
from neuron_lab.trace.sites import Locator

Tally = Callable[[int, int], None]  # (calls, host_ns) a producer counted at one line


def _user(code: CodeType) -> int:
    """Every code object's role without call sites: the user's, so that a producer keys a call by its caller's line
    and counts it, unattributed, in its row."""
    return USER


def _by_count(s: SiteCount) -> tuple[int, int, int]:
    """How a row lists its lines: the most calls first, then by cell and line."""
    return -s.count, s.site.cell or 0, s.site.line


class OpTrace:
    """Collects :class:`OpRow`s from the backend's op events."""

    def __init__(self, locator: Locator | None, stack_limit: int = 3, stack_depth: int = 8) -> None:
        self.locator = locator  # None: call sites off
        self.stack_limit = stack_limit
        self.stack_depth = stack_depth
        self._lock = threading.Lock()
        self._rows: dict[tuple[str, str, str, int], OpRow] = {}  # (op, overload, kind, group size)
        # (op, overload, kind, group size, (file, line, library line) or None): the row, its line's count (None: no
        # line) and the line's tally, so that a call that met its op and line before is one look-up
        self._counts: dict[tuple, tuple[OpRow, SiteCount | None, Tally | None]] = {}
        self.paused = 0  # > 0 while work that is not the user's runs (formatting a value for display)
        # A code object's role (``subscribe(roles=)``), as the locator decides it: one callable a session long (the
        # locator's), so that a producer keeps the roles it learnt from cell to cell.
        self.role: Roles = _user if locator is None else locator.role

    def record(self, event: OpEvent, args: tuple, kwargs: dict) -> tuple[Tally, int] | None:
        """The backend's subscriber (a bound method: the interpreter calls it inline, an instance's ``__call__``
        it does not). Returns the line's tally and how many of its next calls may add a stack (None: no line)."""
        if self.paused:
            return None
        name, overload, kind, reason, shapes, dtypes, host_ns, nbytes, ranks = event
        locator = self.locator
        where = walked = None
        if locator is not None:  # the line from the recorder's caller, the stack from it; it reads frames: no lock
            frame = sys._getframe(1)
            walked = locator.walk(frame, caller=frame.f_back is not None)  # autograd's thread: the recorder's alone
            user, library, _ = walked
            if user is not None:
                where = (user.f_code.co_filename, user.f_lineno,
                         None if library is None else (library.f_code.co_filename, library.f_lineno))
        key = (name, overload, kind, ranks, where)
        with self._lock:  # one take: the row's and the line's counts
            hit = self._counts.get(key)
            if hit is None:
                hit = self._counts[key] = self._first(event, where)
            row, sc, tally = hit
            row.count += 1
            row.host_ns += host_ns
            row.nbytes += nbytes
            if sc is None:
                row.unattributed += 1
                return None if tally is None else (tally, 0)
            sc.count += 1
            more = self.stack_limit - sc.count
            if more < 0:
                return tally, 0
        stack = locator.stack(walked, self.stack_depth)
        with self._lock:
            if stack not in sc.stacks:
                sc.stacks.append(stack)
        return tally, more

    def _tally(self, row: OpRow, sc: SiteCount | None, calls: int, host_ns: int) -> None:
        """Calls of ``row``'s op at ``sc``'s line (None: no line) that a producer counted (no stacks: the line has
        its own)."""
        with self._lock:
            row.count += calls
            row.host_ns += host_ns
            if sc is None:
                row.unattributed += calls
            else:
                sc.count += calls

    def _first(self, event: OpEvent, where: tuple | None) -> tuple[OpRow, SiteCount | None, Tally | None]:
        """The row of a call whose (op, line) is new, made once (under the lock); its line's count and tally."""
        key = (event.name, event.overload, event.kind, event.ranks)
        row = self._rows.get(key)
        if row is None:
            row = self._rows[key] = OpRow(qualified(event.name, event.overload), event.kind, event.reason,
                                          shapes=event.shapes, dtypes=event.dtypes, ranks=event.ranks)
        if where is None:  # with call sites on, a call with no user frame: not one a producer counts by line
            return row, None, partial(self._tally, row, None) if self.locator is None else None
        file, line, via = where
        sc = SiteCount(self.locator.site(file, line), via=None if via is None else self.locator.site(*via))
        row.sites.append(sc)
        return row, sc, partial(self._tally, row, sc)

    @property
    def fallback_calls(self) -> int:
        """CPU fallback and host calls so far: live views read it from their thread."""
        return sum(r.count for r in list(self._rows.values()) if r.kind in OFF_DEVICE)

    @property
    def sync_calls(self) -> int:
        """Device-to-host syncs so far, read the same way."""
        return sum(r.count for r in list(self._rows.values()) if r.kind == SYNC)

    def rows(self, *, copies: bool = False, ordered: bool = True) -> list[OpRow]:
        """In report order (:func:`neuron_lab.kinds.row_order`; ``ordered=False``: as first seen, for a caller that
        orders them itself); sites by count. ``copies``: copied under the lock, for another thread (a live view) to
        read while calls go on."""
        with self._lock:
            rows = [copy.deepcopy(r) for r in self._rows.values()] if copies else list(self._rows.values())
            for r in rows:
                if len(r.sites) > 1:  # most ops come from one line: no sort (a Python key call a site)
                    r.sites.sort(key=_by_count)
        return sorted(rows, key=kinds.row_order) if ordered else rows
