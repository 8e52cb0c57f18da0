"""The lines ``neuron-lab run`` prints while it runs: the start, the kernel's banner, one line per cell.

A cell that touched the device is followed by its report as the extension rendered it in the
kernel (the text under the cell in Jupyter), a ``%%neuron ranks`` cell by its ranks' report (the ranks' renderer's, as
``--nproc`` shows a cell); a failed cell by its traceback.
"""

from __future__ import annotations

from typing import Any

from neuron_lab.report.ranks_rows import ranks_summary_parts
from neuron_lab.report.sites import op_line
from neuron_lab.report.text import render_ranks_text
from neuron_lab.runner.inputs import Program
from neuron_lab.runner.records import FAILED, OK, CellRecord, error_line
from neuron_lab.units import count, format_seconds

INDENT = "    "
OPS_SHOWN = 3  # ops named on a cell's line


def starting(program: Program) -> str:
    n = len(program.code_cells)
    return f"neuron-lab run {program.path} ({program.kind}, {count(n, 'code cell')}): starting a kernel"


def ready(info: dict[str, Any]) -> str:
    """The line when the kernel is ready, or when the notebook's own ``%load_ext neuron_lab`` has run."""
    if info.get("loads_itself"):
        return ("kernel ready · the notebook loads neuron_lab itself (%load_ext neuron_lab); "
                "its cells report from then on")
    what = info.get("banner") or info.get("description") or info.get("backend")
    return f"neuron_lab loaded by the notebook · {what}" if info.get("by_notebook") else f"kernel ready · {what}"


def waiting(rec: CellRecord, total: int, step: str) -> str:
    """A step of a long compile while its cell runs, before the cell's line: ``[7/8] In[7] … compiling Net: ...``."""
    return f"[{rec.number}/{total}] {rec.label} … {step}"


def cell(rec: CellRecord, total: int) -> list[str]:
    """``[3/9] In[3] ok 420.0 ms · 6 CPU fallback calls: aten::atan2.out ×5 at In[3] line 7, ...`` and what follows."""
    parts = [f"[{rec.number}/{total}] {rec.label} {rec.status} {format_seconds(rec.seconds)}"]
    report = rec.as_report()
    if report is not None:
        rows = report.fallbacks
        if rows:
            shown = ", ".join(op_line(r, sites=1) for r in rows[:OPS_SHOWN])
            more = f", {count(len(rows) - OPS_SHOWN, 'more op')}" if len(rows) > OPS_SHOWN else ""
            parts.append(f"{count(report.fallback_calls, 'CPU fallback call')}: {shown}{more}")
        c = report.compiles
        if c:
            at = f" at {', '.join(b.site.label for b in c.breaks if b.site)}" if c.breaks else ""
            parts.append(f"{count(c.graphs, 'graph')}, {count(len(c.breaks), 'graph break')}{at}")
    windows = rec.windows()
    for w in windows:
        parts += ranks_summary_parts(w)
    if rec.error and rec.status == OK:
        parts.append(f"raised {error_line(rec.error)} (tagged raises-exception: the run goes on)")
    elif rec.error:
        parts.append(error_line(rec.error))
    lines = [" · ".join(parts)]
    if rec.touched_device and rec.text:
        lines += [INDENT + line for line in rec.text.splitlines()]
    for w in windows:
        lines += [INDENT + line for line in render_ranks_text(w).splitlines()[1:]]
    if rec.status in FAILED and rec.error and rec.error.get("traceback"):
        lines += [INDENT + line for line in rec.error["traceback"].splitlines()]
    return lines
