"""The in-kernel agent: what a launcher runs inside each kernel or engine it starts, to get each cell's report back.

``neuron-lab run`` (its kernels) and ``%neuron ranks`` (its ipyparallel engines) both call this module by name in
the kernel, never ship code of their own: the runner evaluates ``neuron_lab.agent.after_cell(get_ipython())`` as a
silent user expression, the notebook applies an ipyparallel ``Reference`` to ``neuron_lab.agent.cell_report``. The
agent finds the shell's session where the extension registered it (:func:`neuron_lab.session.shells.session_of`),
keeps each cell's report as data (a :class:`Collector` among the session's listeners) and hands the reports over
on request.

It needs none of the magics: the layers contract keeps it so. The runner loads the extension itself before the
first cell, quietly (``neuron_lab.runner.kernel.install``), or the notebook it runs does (``%load_ext``); an engine's
agent loads it as a notebook does (:func:`join_ranks`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from neuron_lab import backend, settings
from neuron_lab.report.model import Report, Site
from neuron_lab.session import preflight, rank_group, rank_pulse, shells, stuck

if TYPE_CHECKING:  # the runner's process reads this module's wire types (Payload, Script, MIME) without torch
    from neuron_lab.report.ranks import RanksReport
    from neuron_lab.session.notes import OnceNotes
    from neuron_lab.session.session import Session
    from neuron_lab.trace.tracker import Renaming

MIME = "application/vnd.neuron-lab.run.v1+json"
NOTEBOOK_POLL_S = 1.0  # how often an engine checks that the notebook that started it is still there
TORCH_FIRST = "_nl_torch_first"  # set by the engine's first code (session.ranks): torch was imported before it ran


class Payload:
    """A user-expression value that arrives as JSON under :data:`MIME` (how the runner receives what it asked)."""

    def __init__(self, data: Any) -> None:
        self.data = data

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {MIME: json.dumps(self.data, default=str)}


@dataclass
class Script:
    """A script run as cells: chunk N (a ``# %%`` block, from line ``first_lines[N - 1]``) is cell In[N].

    The runner's kernel compiles each chunk at its own lines in the script (``runner.kernel_script``), so a chunk's
    ``In[N] line L`` is the script's line L: only its name changes, to ``train.py:L``.
    """

    path: str  # the name shown: train.py:12
    file: str  # the resolved path, the kernel's ``__file__``
    first_lines: list[int]

    def offset(self, n: int | None) -> int | None:
        """How many lines into the script cell In[N]'s chunk starts; None for a cell that is no chunk."""
        return self.first_lines[n - 1] - 1 if n is not None and 1 <= n <= len(self.first_lines) else None

    def as_script_lines(self, report: Report) -> Renaming | None:
        """A site map: say ``train.py:12`` where the kernel saw ``In[N] line 12``, and title the report so."""
        from neuron_lab.trace.tracker import Renaming

        n = report.cell
        if self.offset(n) is None:
            return None
        label = re.compile(r"^In\[(\d+)\] line (\d+)")

        def frame(f: str) -> str:
            return label.sub(lambda m: f"{self.path}:{m.group(2)}" if self.offset(int(m.group(1))) is not None
                             else m.group(0), f)

        return Renaming(self.line, frame, f"{self.path}:{self.first_lines[n - 1]}")

    def line(self, s: Site) -> Site:
        """A chunk's line as the script's (``In[2] line 12`` -> ``train.py:12``); any other line as it is."""
        return s if self.offset(s.cell) is None else Site(self.path, s.line, s.source)


class Collector:
    """The reports of the cells that finished since the launcher last asked, as data (``Report.as_dict()``), with
    the text shown under the cell when ``text`` is on (the runner prints it): the extension's rendering of the same
    report, then the notes said once a session under it (the int64 note); and the windows a ``%%neuron ranks`` cell
    ran on the ranks (``RanksReport.as_dict()``, under ``ranks``): the ranks' reports, which the runner judges with
    the cell's."""

    def __init__(self, notes: OnceNotes, text: bool = True) -> None:
        self.notes, self.text = notes, text
        self.reports: list[dict[str, Any]] = []
        self.windows: list[dict[str, Any]] = []  # the ranks windows of the cell that runs

    @classmethod
    def attach(cls, session: Session, script: Script | None = None, *, text: bool = True) -> Collector:
        """A new collector, listening to ``session``; a script's lines replace the cells' in every report."""
        collector = cls(session.notes, text)
        if script is not None:
            session.site_maps.append(script.as_script_lines)
        session.listeners.append(collector.keep)
        session.rank_windows.append(collector.keep_window)
        return collector

    @classmethod
    def of(cls, session: Session | None) -> Collector | None:
        """The collector listening to ``session``, if one is."""
        listeners = session.listeners if session is not None else []
        return next((fn.__self__ for fn in listeners if isinstance(getattr(fn, "__self__", None), cls)), None)

    def keep(self, report: Report) -> None:
        kept = {"report": report.as_dict(), "touched_device": report.touched_device}
        if self.windows:
            kept["ranks"], self.windows = self.windows, []
        shown = "\n".join([str(report), *self.notes.said_under(report)]) if self.text else None
        self.reports.append(kept if shown is None else {**kept, "text": shown})

    def keep_window(self, window: RanksReport) -> None:
        """A ``%%neuron ranks`` window of the running cell: it goes with the cell's report."""
        self.windows.append(window.as_dict())

    def hand_over(self) -> list[dict[str, Any]]:
        """The reports kept so far, oldest first; the collector starts empty again."""
        out, self.reports = self.reports, []
        return out


# -- neuron-lab run ----------------------------------------------------------------------------------------------------
def attach(shell: Any, script: dict[str, Any] | None = None, said: str = "") -> Payload:
    """Start keeping the reports of the session just loaded into ``shell``; what loading it ``said`` (its banner),
    as the runner shows it."""
    from neuron_lab.session.session import banner

    session = shells.session_of(shell)
    Collector.attach(session, None if script is None else Script(**script))
    return Payload(_info(banner(session) if _on_rank_device(session) else said))


def preflight_rank(shell: Any, timeout_s: float) -> Payload:
    """``neuron-lab run --nproc``: this rank's preflight, before the program's first cell (its
    ``init_process_group``); the table when the ranks differ (every rank gets the same), else None."""
    try:
        preflight.check(timeout_s)
    except preflight.PreflightMismatch as e:
        return Payload({"table": str(e)})
    return Payload({"table": None})


def after_cell(shell: Any, script: dict[str, Any] | None = None) -> Payload:
    """The reports of the cells that finished since the last call, oldest first, and, the first time the
    extension is found loaded by the notebook itself (or loaded again), what :func:`attach` would have said."""
    session = shells.session_of(shell)
    if session is None:
        return Payload({"loaded": None, "reports": []})
    collector, loaded = Collector.of(session), None
    if collector is None:
        collector = Collector.attach(session, None if script is None else Script(**script))
        _on_rank_device(session)
        from neuron_lab.session.session import banner

        loaded = _info(banner(session))
    return Payload({"loaded": loaded, "reports": collector.hand_over()})


def _on_rank_device(session: Session) -> bool:
    """A torchrun rank (``neuron-lab run --nproc``) owns ``neuron:{LOCAL_RANK}``, its current device: make that the
    notebook device, as it is in the script's own ``torch.neuron.current_device()``. Whether it changed."""
    if not backend.is_active() or settings.env("LOCAL_RANK").raw() is None:
        return False
    import torch

    dev = torch.device("neuron", torch.neuron.current_device())
    if session.device == dev:
        return False
    session.set_device(dev)
    return True


def _info(said: str) -> dict[str, Any]:
    coverage = backend.active().coverage if backend.is_active() else None
    return {"banner": said, "backend": backend.state().kind,
            "description": backend.active().description if backend.is_active() else backend.state().reason,
            "coverage": coverage.name if coverage is not None else None}


# -- %neuron ranks -----------------------------------------------------------------------------------------------------
def join_ranks(shell: Any, timeout_s: float, notebook_pid: int | None = None,
               controller_pid: int | None = None) -> dict[str, Any]:
    """An engine becomes its rank, once its variables are set: neuron_lab loaded as in a notebook, the preflight
    passed, the process group joined, its device the notebook device; its reports kept for :func:`cell_report`
    instead of shown. It ends, and
    ends the controller, when the notebook's process is gone without stopping it (killed, or died)."""
    torch_first = shell.user_ns.pop(TORCH_FIRST, True)
    if notebook_pid is not None:
        threading.Thread(target=_end_with, args=(notebook_pid, controller_pid), daemon=True,
                         name="neuron_lab: end with the notebook").start()
    shell.run_line_magic("load_ext", "neuron_lab")
    import torch
    import torch.distributed as dist
    import torch_neuronx  # noqa: F401  (the `neuron` process-group backend, as on a Trn instance)

    preflight.check(timeout_s)  # ranks that differ stop here, every one with the same table, not in a hang
    dist.init_process_group(backend="neuron", timeout=timedelta(seconds=timeout_s))
    rank_group.keep()  # a cell's own init_process_group/destroy_process_group meet this group
    session = shells.session_of(shell)
    session.config.auto_report = False  # the notebook shows all ranks in one report instead
    session.set_device(torch.device("neuron", torch.neuron.current_device()))
    Collector.attach(session, text=False)
    stuck.serve(dist.get_rank(), lambda: _where(shell))  # a cell stuck past its deadline: where this rank is
    rank_pulse.serve(dist.get_rank(), session)  # the notebook's dashboard: this rank's memory and fallbacks, live
    return {"pid": os.getpid(), "device": str(session.device), "torch_first": torch_first}


def answer_where(shell: Any) -> Payload:
    """``neuron-lab run --nproc``: from now on this rank says where it is when the runner asks (a cell past
    ``--timeout``), as an engine of ``%neuron ranks`` does."""
    stuck.serve(int(settings.env("RANK").text() or 0), lambda: _where(shell))
    return Payload(None)


def _where(shell: Any) -> dict[str, Any]:
    """Where this rank's main thread is: the collective it is blocked in, and its cell's line (asked from a thread;
    no line before the notebook loaded neuron_lab)."""
    session = shells.session_of(shell)
    site = None if session is None else session.locator.locate(stuck.main_frame())
    active = backend.active() if backend.is_active() else None
    return {"collective": active.collective_waiting() if active is not None else None,
            "site": None if site is None else dataclasses.asdict(site),
            "told": active is not None and active.tells_collectives}


def _end_with(notebook_pid: int, controller_pid: int | None) -> None:
    """Once the notebook's process is gone, the controller and this engine go too (a stop would have ended them)."""
    import psutil

    try:
        notebook = psutil.Process(notebook_pid)
        while notebook.is_running() and notebook.status() != psutil.STATUS_ZOMBIE:
            time.sleep(NOTEBOOK_POLL_S)
    except psutil.NoSuchProcess:
        pass
    if controller_pid is not None:
        try:
            psutil.Process(controller_pid).terminate()
        except psutil.NoSuchProcess:
            pass
    os._exit(0)


def cell_report(shell: Any, cell: int) -> str | None:
    """The report of cell number ``cell`` as JSON, once; None when that cell made none (an interrupted earlier
    cell's report is not this one's)."""
    collector = Collector.of(shells.session_of(shell))
    reports = collector.hand_over() if collector is not None else []
    report = reports[-1]["report"] if reports else None
    return None if report is None or report["cell"] != cell else json.dumps(report)


def ready(shell: Any) -> None:
    """A request that does nothing: answered once the kernel takes requests again (after a failed cell)."""


def leave_ranks(shell: Any) -> None:
    """The rank leaves its process group (``%neuron ranks stop``), torch's own functions back first."""
    import torch.distributed as dist

    rank_group.release()
    if dist.is_initialized():
        dist.destroy_process_group()
