"""The head of the ``--html`` export: the run's summary block and each gate's verdict, above the executed notebook.

A reader of a CI artifact sees first what the terminal's last lines said: the summary block itself (cells run,
failures, the run's report, peak memory, time, the traces, each gate's line, a dead kernel), the very lines
``neuron-lab run`` printed, then a table of the gates (limit, measured value, cells blamed: ``GateResult``, as in
the ``--json`` file), then the cells with their reports.
"""

from __future__ import annotations

from html import escape

from neuron_lab.runner.gates import GateResult

CSS = """<style>
.neuron-lab-run {font-family: system-ui, sans-serif; font-size: 13px; margin: 0 0 1.5em 0; padding: 0.8em 1em;
  border: 1px solid #bbb; border-radius: 4px}
.neuron-lab-run h2 {font-size: 15px; margin: 0 0 0.5em 0}
.neuron-lab-run table {border-collapse: collapse; margin: 0.4em 0}
.neuron-lab-run th, .neuron-lab-run td {text-align: left; padding: 2px 10px 2px 0; vertical-align: top}
.neuron-lab-run .fail {color: #b00020; font-weight: bold}
.neuron-lab-run .pass {color: #1b7f3b; font-weight: bold}
.neuron-lab-run li {font-family: monospace; font-size: 12px}
.neuron-lab-run pre {font-size: 12px; overflow-x: auto; margin: 0.4em 0}
</style>"""


def head(title: str, verdict: str, block: list[str], checked: list[GateResult]) -> str:
    """``<section class="neuron-lab-run">``: the verdict, the summary block as the terminal printed it (``block``),
    then the gates table."""
    parts = [CSS, '<section class="neuron-lab-run">', f"<h2>{escape(title)}</h2>", f"<p>{escape(verdict)}</p>",
             f'<pre class="neuron-lab-run-summary">{escape(chr(10).join(block))}</pre>',
             gates_table(checked, why=False) if checked else "<p>gates: none enabled</p>", "</section>"]
    return "\n".join(parts)


def gates_table(checked: list[GateResult], why: bool = True) -> str:
    """A row per gate; with ``why``, each gate's line below (where no summary block above says it already)."""
    head_row = "".join(f"<th>{h}</th>" for h in ("gate", "verdict", "limit", "measured", "cells blamed"))
    rows = []
    for g in checked:
        verdict = "pass" if g.passed else "FAIL"
        cells = (escape(g.gate), f'<span class="{verdict.lower()}">{verdict}</span>', escape(g.limit),
                 escape(g.measured), escape(", ".join(g.blamed) or "none"))
        rows.append(f'<tr class="neuron-lab-gate">{"".join(f"<td>{c}</td>" for c in cells)}</tr>')
    lines = "".join(f"<li>{escape(g.line)}</li>" for g in checked)
    return (f'<table class="neuron-lab-gates"><thead><tr>{head_row}</tr></thead><tbody>{"".join(rows)}</tbody>'
            "</table>" + (f"\n<ul>{lines}</ul>" if why else ""))
