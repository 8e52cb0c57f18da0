"""The runner's own calls inside the kernel: load the extension before the first cell, and arm ``--trace``.

``neuron-lab run`` sends silent executions (no history, no cell events, no output) that evaluate a user
expression here: :func:`install` once before the first cell and, with ``--trace``, :func:`arm_trace` before every
cell and :func:`trace_missing` after one that wrote no trace. Each cell's report comes back through the in-kernel
agent both launchers share (``neuron_lab.agent.after_cell``). A notebook that loads the extension itself
(``%load_ext neuron_lab``) gets no :func:`install`: its first cells may set what the backend reads when it starts
(``%env NEURON_LAB_DEVICE_MEMORY=...``), so nothing of neuron_lab, not even torch, is imported before it; the agent
attaches once the notebook has loaded it.

Reports travel as data (``Report.as_dict()``) with the text the extension's renderer made of the
same Report, so the runner needs no second copy of the model or of its renderers.
"""

from __future__ import annotations

import io
from contextlib import redirect_stdout
from typing import Any

from neuron_lab.agent import Payload


def install(shell: Any, script: dict[str, Any] | None = None) -> Payload:
    """Load the extension (quietly: the runner prints the banner) and start keeping reports.

    It loads through :func:`neuron_lab.extension.load`, not IPython's extension manager, so a
    notebook's own ``%load_ext neuron_lab`` later finds the session there and neither loads twice nor
    prints "already loaded".
    """
    from neuron_lab import agent, extension

    out = io.StringIO()
    with redirect_stdout(out):
        extension.load(shell)
    if script is not None:
        from neuron_lab.runner.kernel_script import compile_as_script

        shell.user_ns["__file__"] = script["file"]
        compile_as_script(shell.compile, agent.Script(**script))
    return agent.attach(shell, script, out.getvalue().strip())


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
