"""``neuron-lab run --trace DIR`` inside the kernel: each cell runs under torch.profiler and leaves its Chrome trace.

The profile is the one ``%%neuron profile --export`` takes (:class:`~neuron_lab.trace.profile.OpProfile`, Python
stacks on), started as the cell starts and read as it ends, before its report is made, so the report carries
the same op table and its lines are the script's. The runner names each cell's file just before the cell runs
(:meth:`CellTracer.arm`): only it knows which cell of the input is next. A ``%%neuron profile`` cell profiles
itself (profiles do not nest): it gets its own table and no file here.
"""

from __future__ import annotations

import re
from typing import Any

from neuron_lab.trace.profile import OpProfile
from neuron_lab.trace.tracker import Tracker

_PROFILES_ITSELF = re.compile(r"^\s*%%neuron\s+profile\b")


class CellTracer:
    """Profiles the next cell the runner :meth:`arm`\\ s, into the file it names."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.path: str | None = None  # where the armed cell's trace goes
        self._profile: OpProfile | None = None
        self._cell: Tracker | None = None  # the open cell's tracker, once this cell was seen

    @classmethod
    def of(cls, session: Any) -> CellTracer:
        """The tracer of ``session``, attached on first use."""
        found = next((fn.__self__ for fn in session.finishing if isinstance(getattr(fn, "__self__", None), cls)),
                     None)
        if found is None:
            found = cls(session)
            session.shell.events.register("pre_run_cell", found.start)
            session.finishing.append(found.finish)
        return found

    def arm(self, path: str) -> None:
        self.path = path

    def start(self, info: Any) -> None:
        """IPython's ``pre_run_cell``, after the session opened the cell (a nested ``run_cell`` is part of it)."""
        cell = self.session.running
        if self.path is None or cell is None or cell is self._cell:
            return
        self._cell = cell
        if _PROFILES_ITSELF.match(getattr(info, "raw_cell", "") or ""):
            self.path = None
            return
        self._profile = OpProfile(self.session.locator, with_stack=True).start()

    def finish(self, cell: Tracker) -> None:
        """The session's ``finishing``: write the trace, and put the profile on the cell's report."""
        profile, self._profile, path, self.path = self._profile, None, self.path, None
        if profile is None:
            return
        with cell.excluded():
            cell.report.profiled = profile.result(export=path)
