"""The head of the ``--html`` export: the run's summary and each gate's verdict, above the executed notebook.

A reader of a CI artifact sees first what the terminal's last lines said (cells run, failures, CPU
fallbacks, peak memory, time; pass or fail per gate with its limit, the measured value and the
cells blamed), then the cells with their reports. The facts are the ``--json`` file's
(``Summary.as_dict()``, ``GateResult.as_dict()``), so the two never disagree.
"""

from __future__ import annotations

from html import escape

from neuron_lab.runner.gates import GateResult
from neuron_lab.runner.summary import Summary, op_line
from neuron_lab.units import count, format_capacity, format_seconds, format_size

CSS = """<style>
.neuron-lab-run {font-family: system-ui, sans-serif; font-size: 13px; margin: 0 0 1.5em 0; padding: 0.8em 1em;
  border: 1px solid #bbb; border-radius: 4px}
.neuron-lab-run h2 {font-size: 15px; margin: 0 0 0.5em 0}
.neuron-lab-run table {border-collapse: collapse; margin: 0.4em 0}
.neuron-lab-run th, .neuron-lab-run td {text-align: left; padding: 2px 10px 2px 0; vertical-align: top}
.neuron-lab-run .fail {color: #b00020; font-weight: bold}
.neuron-lab-run .pass {color: #1b7f3b; font-weight: bold}
.neuron-lab-run li {font-family: monospace; font-size: 12px}
</style>"""


def head(title: str, verdict: str, s: Summary, checked: list[GateResult]) -> str:
    """``<section class="neuron-lab-run">``: the run summary table, then the gates table and why each ended so."""
    rows = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in facts(s))
    parts = [CSS, '<section class="neuron-lab-run">', f"<h2>{escape(title)}</h2>", f"<p>{escape(verdict)}</p>",
             f'<table class="neuron-lab-run-summary">{rows}</table>']
    if checked:
        parts.append(gates_table(checked))
    else:
        parts.append("<p>gates: none enabled</p>")
    parts.append("</section>")
    return "\n".join(parts)


def facts(s: Summary) -> list[tuple[str, str]]:
    """(name, value) of the run summary, in the order the table shows them."""
    failures = "; ".join(f"{e.label} [{e.number}/{s.cells}]: {e.status}: "
                         + ": ".join(v for v in ((e.error or {}).get("ename"), (e.error or {}).get("evalue")) if v)
                         for e in s.errors) or "none"
    t = s.total
    fallbacks = "none"
    if t.fallbacks:
        fallbacks = (f"{count(t.fallback_calls, 'call')} of {count(len(t.fallbacks), 'op')}: "
                     + "; ".join(op_line(r) for r in t.fallbacks))
    peak = "no cell reported"
    if s.peak_at is not None:
        peak = f"{format_size(t.memory.peak)} of {format_capacity(t.memory.capacity)}, in {s.peak_at}"
    return [("cells run", f"{s.ran} of {s.cells}"), ("failures", failures), ("CPU fallbacks", fallbacks),
            ("peak device memory", peak), ("time", f"{format_seconds(s.seconds)} (kernel start included)")]


def gates_table(checked: list[GateResult]) -> str:
    head_row = "".join(f"<th>{h}</th>" for h in ("gate", "verdict", "limit", "measured", "cells blamed"))
    rows = []
    for g in checked:
        verdict = "pass" if g.passed else "FAIL"
        cells = (escape(g.gate), f'<span class="{verdict.lower()}">{verdict}</span>', escape(g.limit),
                 escape(g.measured), escape(", ".join(g.blamed) or "none"))
        rows.append(f'<tr class="neuron-lab-gate">{"".join(f"<td>{c}</td>" for c in cells)}</tr>')
    why = "".join(f"<li>{escape(g.line)}</li>" for g in checked)
    return (f'<table class="neuron-lab-gates"><thead><tr>{head_row}</tr></thead><tbody>{"".join(rows)}</tbody>'
            f"</table>\n<ul>{why}</ul>")
