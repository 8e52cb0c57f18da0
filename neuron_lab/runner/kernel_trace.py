"""``neuron-lab run --trace DIR`` inside the kernel: each cell runs under torch.profiler and leaves its Chrome trace.

The profile is the one ``%%neuron profile --export`` takes (:class:`~neuron_lab.trace.profile.OpProfile`, Python
stacks on), started as the cell starts and read as it ends, before its report is made, so the report carries
the same op table and its lines are the script's. The runner names each cell's file just before the cell runs
(:meth:`CellTracer.arm`): only it knows which cell of the input is next.

The tracer never changes what a cell does: its profile gives way to one the cell runs itself (``%%neuron profile``,
``neuron_lab.profile()``, a raw ``torch.profiler.profile()``: profiles do not nest), and that cell writes no
file; :attr:`CellTracer.missing` says why a cell wrote none, for the runner to print.
"""

from __future__ import annotations

import os
from typing import Any

from neuron_lab.trace.profile import OpProfile
from neuron_lab.trace.tracker import Tracker

OWN_PROFILER = "the cell ran its own profiler"


class CellTracer:
    """Profiles the next cell the runner :meth:`arm`\\ s, into the file it names.

    It hangs on the session's ``starting`` and ``finishing`` lists, which ``Session.close`` clears: an unloaded
    (or reloaded) extension leaves no tracer behind.
    """

    def __init__(self, session: Any) -> None:
        self.session = session
        self.path: str | None = None  # where the armed cell's trace goes
        self.missing: str | None = None  # why the last armed cell wrote no trace
        self._profile: OpProfile | None = None

    @classmethod
    def find(cls, session: Any) -> CellTracer | None:
        """The tracer attached to ``session``, if one is."""
        return next((fn.__self__ for fn in session.finishing if isinstance(getattr(fn, "__self__", None), cls)),
                    None)

    @classmethod
    def of(cls, session: Any) -> CellTracer:
        """The tracer of ``session``, attached on first use."""
        found = cls.find(session)
        if found is None:
            found = cls(session)
            session.starting.append(found.start)
            session.finishing.append(found.finish)
        return found

    def arm(self, path: str) -> None:
        self.path, self.missing = path, None

    def start(self, session: Any) -> None:
        """The session's ``starting``: a cell of the notebook opened (a nested ``run_cell`` is part of it)."""
        if self.path is None:
            return
        try:
            self._profile = OpProfile(session.locator, with_stack=True, yields=True, export=self.path).start()
        except ValueError:  # a profiler the script started in an earlier cell still runs: leave it be
            self.missing = "torch.profiler was already running (the script's own)"

    def finish(self, cell: Tracker) -> None:
        """The session's ``finishing``: write the trace, and hand the profile to the cell's tracker for its report."""
        profile, self._profile, path, self.path = self._profile, None, self.path, None
        if profile is None or path is None:
            return
        with cell.excluded():
            profile.stop()
            if profile.gave_way:
                self.missing = OWN_PROFILER
                return
            try:
                profiled = profile.result(export=path)
            except Exception as e:  # the export, or reading what it recorded: the cell's work is done, say why
                self.missing = f"cannot write {path}: {type(e).__name__}: {e}"
                return
        if not os.path.isfile(path):  # Kineto logs a failed write (a folder in the way) and raises nothing
            self.missing = f"cannot write {path}: the profiler wrote no file there (see the kernel's log)"
            profiled.trace_path = None  # the op table stays; the report names no file
        cell.attach_profile(profiled)
