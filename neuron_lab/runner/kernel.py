"""The runner's half inside the kernel: load the extension, keep each cell's report, hand them over on request.

``neuron-lab run`` sends two kinds of silent executions (no history, no cell events, no output) that
evaluate a user expression here: :func:`install` once before the first cell, :func:`after_cell` after
every cell. A notebook that loads the extension itself (``%load_ext neuron_lab``) gets no
:func:`install`: its first cells may set what the backend reads when it starts
(``%env NEURON_LAB_DEVICE_MEMORY=...``), so nothing of neuron_lab, not even torch, is imported before
it; :func:`after_cell` attaches once the notebook has loaded it.

Reports travel as data (``Report.as_dict()``) with the text the extension's renderer made of the
same Report, so the runner needs no second copy of the model or of its renderers.
"""

from __future__ import annotations

import io
import json
import re
from contextlib import redirect_stdout
from dataclasses import replace
from typing import Any

from neuron_lab.report.model import Report, Site

MIME = "application/vnd.neuron-lab.run.v1+json"

_taken: list[dict[str, Any]] = []
_script: dict[str, Any] | None = None  # {"path": shown name, "first_lines": [line of chunk 1, ...]}


class Payload:
    """A user-expression value that arrives as JSON under :data:`MIME`."""

    def __init__(self, data: Any) -> None:
        self.data = data

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {MIME: json.dumps(self.data, default=str)}


def install(shell: Any, script: dict[str, Any] | None = None) -> Payload:
    """Load the extension (quietly: the runner prints the banner) and start keeping reports.

    It loads through :func:`neuron_lab.extension.load`, not IPython's extension manager, so a
    notebook's own ``%load_ext neuron_lab`` later finds the session there and neither loads twice nor
    prints "already loaded".
    """
    global _script
    from neuron_lab import extension

    out = io.StringIO()
    with redirect_stdout(out):
        extension.load(shell)
    _script = script
    if script is not None:
        shell.user_ns["__file__"] = script["file"]
    _attach(extension.session_of(shell))
    return Payload(_info(out.getvalue().strip()))


def after_cell(shell: Any) -> Payload:
    """The reports of the cells that finished since the last call, oldest first, and, the first time the
    extension is found loaded by the notebook itself, what :func:`install` would have said."""
    from neuron_lab import extension

    session = extension.session_of(shell)
    loaded = None
    if session is not None and _keep not in session.listeners:
        _attach(session)
        loaded = _info(extension.banner(session))
    out = list(_taken)
    _taken.clear()
    return Payload({"loaded": loaded, "reports": out})


def _attach(session: Any) -> None:
    session.listeners.insert(0, _keep)  # first: script lines are set before the extension shows the report


def _info(banner: str) -> dict[str, Any]:
    from neuron_lab import backend

    profile = backend.active().profile if backend.is_active() else None
    return {"banner": banner, "backend": backend.state().kind,
            "description": backend.active().description if backend.is_active() else backend.state().reason,
            "profile": profile.name if profile is not None else None}


def _keep(report: Report) -> None:
    if _script is not None:
        as_script_lines(report, _script["path"], _script["first_lines"])
    _taken.append({"report": report.as_dict(), "text": str(report), "touched_device": report.touched_device})


def as_script_lines(report: Report, path: str, first_lines: list[int]) -> None:
    """Say ``train.py:12`` where the kernel saw ``In[N] line L``: chunk N of the script is cell In[N]."""
    n = report.cell
    if n is None or not 1 <= n <= len(first_lines):
        return
    offset = first_lines[n - 1] - 1
    label = re.compile(rf"^In\[{n}\] line (\d+)")

    def fix(site: Site | None) -> Site | None:
        if site is None or site.cell != n:
            return site
        return Site(path, site.line + offset, site.source)

    def fix_frame(frame: str) -> str:
        return label.sub(lambda m: f"{path}:{int(m.group(1)) + offset}", frame)

    for row in report.ops_not_native:
        for sc in row.sites:
            sc.site = fix(sc.site)
            sc.stacks = [tuple(fix_frame(f) for f in st) for st in sc.stacks]
    c = report.compiles
    c.breaks = [replace(b, site=fix(b.site)) for b in c.breaks]
    c.recompiles = [replace(r, site=fix(r.site)) for r in c.recompiles]
    report.title = f"{path}:{first_lines[n - 1]}"
