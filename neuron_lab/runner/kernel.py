"""The runner's half inside the kernel: load the extension, keep each cell's report, hand them over on request.

``neuron-lab run`` sends silent executions (no history, no cell events, no output) that evaluate a user
expression here: :func:`install` once before the first cell, :func:`after_cell` after every cell, and with
``--trace`` :func:`arm_trace` before every cell and :func:`trace_missing` after one that wrote no trace. A
notebook that loads the extension itself (``%load_ext neuron_lab``) gets no :func:`install`: its first cells may
set what the backend reads when it starts (``%env NEURON_LAB_DEVICE_MEMORY=...``), so nothing of neuron_lab, not
even torch, is imported before it; :func:`after_cell` attaches once the notebook has loaded it.

Everything the runner keeps in the kernel is one :class:`Collector`, registered with the session as a
listener (so :func:`after_cell` finds it there again) and, for a script, a :class:`Script` registered as one
of the session's site maps (so every report, the one the extension shows included, names the script's lines).

Reports travel as data (``Report.as_dict()``) with the text the extension's renderer made of the
same Report, so the runner needs no second copy of the model or of its renderers.
"""

from __future__ import annotations

import io
import json
import os
import re
from contextlib import redirect_stdout
from dataclasses import dataclass
from typing import Any

from neuron_lab.report.model import Report, Site
from neuron_lab.trace.tracker import Renaming

MIME = "application/vnd.neuron-lab.run.v1+json"


class Payload:
    """A user-expression value that arrives as JSON under :data:`MIME`."""

    def __init__(self, data: Any) -> None:
        self.data = data

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {MIME: json.dumps(self.data, default=str)}


@dataclass
class Script:
    """A script run as cells: chunk N (a ``# %%`` block, from line ``first_lines[N - 1]``) is cell In[N]."""

    path: str  # the name shown: train.py:12
    file: str  # the resolved path, the kernel's ``__file__``
    first_lines: list[int]

    def as_script_lines(self, report: Report) -> Renaming | None:
        """A site map: say ``train.py:12`` where the kernel saw ``In[N] line L``, and title the report so."""
        n = report.cell
        if n is None or not 1 <= n <= len(self.first_lines):
            return None
        offset = self.first_lines[n - 1] - 1
        label = re.compile(rf"^In\[{n}\] line (\d+)")

        def site(s: Site) -> Site:
            return s if s.cell != n else Site(self.path, s.line + offset, s.source)

        def frame(f: str) -> str:
            return label.sub(lambda m: f"{self.path}:{int(m.group(1)) + offset}", f)

        return Renaming(site, frame, f"{self.path}:{self.first_lines[n - 1]}")


class Collector:
    """The reports of the cells that finished since the runner last asked, as the runner receives them."""

    def __init__(self) -> None:
        self.reports: list[dict[str, Any]] = []

    @classmethod
    def attach(cls, session: Any, script: Script | None) -> Collector:
        """A new collector, listening to ``session``; a script's lines replace the cells' in every report."""
        collector = cls()
        if script is not None:
            session.site_maps.append(script.as_script_lines)
        session.listeners.append(collector.keep)
        return collector

    @classmethod
    def of(cls, session: Any) -> Collector | None:
        """The collector listening to ``session``, if one is."""
        return next((fn.__self__ for fn in session.listeners if isinstance(getattr(fn, "__self__", None), cls)),
                    None)

    def keep(self, report: Report) -> None:
        self.reports.append({"report": report.as_dict(), "text": str(report),
                             "touched_device": report.touched_device})

    def hand_over(self) -> list[dict[str, Any]]:
        """The reports kept so far, oldest first; the collector starts empty again."""
        out, self.reports = self.reports, []
        return out


def install(shell: Any, script: dict[str, Any] | None = None) -> Payload:
    """Load the extension (quietly: the runner prints the banner) and start keeping reports.

    It loads through :func:`neuron_lab.extension.load`, not IPython's extension manager, so a
    notebook's own ``%load_ext neuron_lab`` later finds the session there and neither loads twice nor
    prints "already loaded".
    """
    from neuron_lab import extension

    out = io.StringIO()
    with redirect_stdout(out):
        extension.load(shell)
    if script is not None:
        shell.user_ns["__file__"] = script["file"]
    session = extension.session_of(shell)
    Collector.attach(session, None if script is None else Script(**script))
    return Payload(_info(extension.banner(session) if _on_rank_device(session) else out.getvalue().strip()))


def after_cell(shell: Any, script: dict[str, Any] | None = None) -> Payload:
    """The reports of the cells that finished since the last call, oldest first, and, the first time the
    extension is found loaded by the notebook itself (or loaded again), what :func:`install` would have said."""
    from neuron_lab import extension

    session = extension.session_of(shell)
    if session is None:
        return Payload({"loaded": None, "reports": []})
    collector, loaded = Collector.of(session), None
    if collector is None:
        collector = Collector.attach(session, None if script is None else Script(**script))
        _on_rank_device(session)
        loaded = _info(extension.banner(session))
    return Payload({"loaded": loaded, "reports": collector.hand_over()})


def arm_trace(shell: Any, path: str) -> Payload:
    """``--trace``: the next cell runs under the profiler and writes its Chrome trace to ``path``; False while
    the extension is not loaded yet (a notebook that loads it itself: its cells before that are not traced)."""
    from neuron_lab import extension
    from neuron_lab.runner.kernel_trace import CellTracer

    session = extension.session_of(shell)
    if session is None:
        return Payload(False)
    CellTracer.of(session).arm(path)
    return Payload(True)


def trace_missing(shell: Any) -> Payload:
    """``--trace``: why the cell just run wrote no trace (None when it wrote one, or nothing was armed)."""
    from neuron_lab import extension
    from neuron_lab.runner.kernel_trace import CellTracer

    session = extension.session_of(shell)
    tracer = None if session is None else CellTracer.find(session)
    return Payload(None if tracer is None else tracer.missing)


def _on_rank_device(session: Any) -> bool:
    """A torchrun rank (``neuron-lab run --nproc``) owns ``neuron:{LOCAL_RANK}``, its current device: make that the
    notebook device, as it is in the script's own ``torch.neuron.current_device()``. Whether it changed."""
    from neuron_lab import backend

    if not backend.is_active() or "LOCAL_RANK" not in os.environ:
        return False
    import torch

    dev = torch.device("neuron", torch.neuron.current_device())
    if session.device == dev:
        return False
    session.set_device(dev)
    return True


def _info(banner: str) -> dict[str, Any]:
    from neuron_lab import backend

    profile = backend.active().profile if backend.is_active() else None
    return {"banner": banner, "backend": backend.state().kind,
            "description": backend.active().description if backend.is_active() else backend.state().reason,
            "profile": profile.name if profile is not None else None}
