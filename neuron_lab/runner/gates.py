"""The CI gates of ``neuron-lab run``: each enabled gate passes or fails over the reports of the cells that ran.

A gate reads :class:`Report` objects only, so it judges exactly what the cells' reports and the
summary show; each result carries the line that says why.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from neuron_lab.kinds import OFF_DEVICE
from neuron_lab.report.aggregate import merge_rows
from neuron_lab.report.model import Report
from neuron_lab.runner.options import op_matches
from neuron_lab.runner.summary import op_line
from neuron_lab.units import count, format_size


@dataclass
class GateResult:
    gate: str  # the option, with its value: "--max-peak-memory 2.00 GiB"
    passed: bool
    why: str

    @property
    def line(self) -> str:
        return f"{'pass' if self.passed else 'FAIL'}  {self.gate}: {self.why}"

    def as_dict(self) -> dict[str, Any]:
        return {"gate": self.gate, "passed": self.passed, "why": self.why}


def evaluate(reports: list[Report], args: argparse.Namespace) -> list[GateResult]:
    """The results of the gates ``args`` enables, in the order of ``--help``."""
    out = []
    if args.fail_on_fallback:
        out.append(fallback_gate(reports, args.allow_fallback))
    if args.max_peak_memory is not None:
        out.append(memory_gate(reports, args.max_peak_memory))
    if args.fail_on_graph_break:
        out.append(graph_break_gate(reports))
    return out


def fallback_gate(reports: list[Report], allowed: list[str]) -> GateResult:
    rows = [r for r in merge_rows(reports) if r.kind in OFF_DEVICE]
    failing = [r for r in rows if not any(op_matches(spec, r.op) for spec in allowed)]
    exempt = [r for r in rows if r not in failing]
    unused = [spec for spec in allowed if not any(op_matches(spec, r.op) for r in rows)]
    notes = []
    if exempt:
        notes.append("allowed: " + ", ".join(f"{r.op} ×{r.count:,}" for r in exempt))
    if unused:
        notes.append("--allow-fallback " + ", ".join(unused) + " matched no fallback")
    if failing:
        calls = sum(r.count for r in failing)
        why = (f"{count(len(failing), 'op')} ran on the CPU ({count(calls, 'call')}): "
               + "; ".join(op_line(r) for r in failing)
               + " (exempt one with --allow-fallback OP)")
    else:
        why = "no CPU fallbacks" if not rows else "only allowed CPU fallbacks"
    return GateResult("--fail-on-fallback", not failing, "; ".join([why, *notes]))


def memory_gate(reports: list[Report], limit: int) -> GateResult:
    over = [r for r in reports if r.memory.peak > limit]
    name = f"--max-peak-memory {format_size(limit)}"
    if over:
        cells = ", ".join(f"{r.title} {format_size(r.memory.peak)}" for r in over)
        return GateResult(name, False, f"{count(len(over), 'cell')} peaked above it: {cells}")
    peak = max((r.memory.peak for r in reports), default=0)
    return GateResult(name, True, f"the highest peak was {format_size(peak)}")


def graph_break_gate(reports: list[Report]) -> GateResult:
    breaks = [b for r in reports for b in r.compiles.breaks]
    if not breaks:
        return GateResult("--fail-on-graph-break", True, "no graph breaks")
    where = "; ".join((f"{b.site.label}: {b.site.source}" if b.site else "an unknown line") + f" ({b.reason})"
                      for b in breaks)
    return GateResult("--fail-on-graph-break", False, f"{count(len(breaks), 'graph break')}: {where}")
