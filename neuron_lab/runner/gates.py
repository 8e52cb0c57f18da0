"""The CI gates of ``neuron-lab run``: each enabled gate passes or fails over the reports of the cells that ran.

A gate reads :class:`Report` objects only, so it judges exactly what the cells' reports and the
summary show; each result carries the line that says why.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

from neuron_lab.kinds import ABORT, KINDS, OFF_DEVICE, UNSUPPORTED
from neuron_lab.report.aggregate import merge_rows
from neuron_lab.report.model import Report
from neuron_lab.report.sites import called_at, op_line
from neuron_lab.runner.options import op_matches
from neuron_lab.units import count, format_size


@dataclass
class GateResult:
    gate: str  # the option, with its value: "--max-peak-memory 2.00 GiB"
    passed: bool
    why: str
    limit: str = ""  # what the gate allows: "2.00 GiB", "no CPU fallbacks except aten::normal*"
    measured: str = ""  # what the run did against it: "3.10 GiB in In[4]", "3 calls of 1 op"
    blamed: list[str] = field(default_factory=list)  # the cells that made it fail: ["In[4]"]

    @property
    def line(self) -> str:
        return f"{'pass' if self.passed else 'FAIL'}  {self.gate}: {self.why}"

    def as_dict(self) -> dict[str, Any]:
        return {"gate": self.gate, "passed": self.passed, "why": self.why, "limit": self.limit,
                "measured": self.measured, "blamed": self.blamed}


def said(checked: list[GateResult]) -> list[str]:
    """The gates' lines of the run's summary block (none when no gate is enabled)."""
    return ["gates:", *(f"  {g.line}" for g in checked)] if checked else []


def evaluate(reports: list[Report], args: argparse.Namespace) -> list[GateResult]:
    """The results of the gates ``args`` enables, in the order of ``--help``."""
    out = []
    if args.fail_on_fallback:
        out.append(fallback_gate(reports, args.allow_fallback))
    if args.max_peak_memory is not None:
        out.append(memory_gate(reports, args.max_peak_memory))
    if args.fail_on_graph_break:
        out.append(graph_break_gate(reports))
    if args.fail_on_unsupported:
        out.append(kind_gate(reports, UNSUPPORTED, "--fail-on-unsupported"))
    if args.fail_on_abort:
        out.append(kind_gate(reports, ABORT, "--fail-on-abort"))
    return out


def fallback_gate(reports: list[Report], allowed: list[str]) -> GateResult:
    def exempt(op: str) -> bool:
        return any(op_matches(spec, op) for spec in allowed)

    rows = [r for r in merge_rows(reports) if r.kind in OFF_DEVICE]
    failing = [r for r in rows if not exempt(r.op)]
    unused = [spec for spec in allowed if not any(op_matches(spec, r.op) for r in rows)]
    notes = []
    if len(failing) < len(rows):
        notes.append("allowed: " + ", ".join(f"{r.op} ×{r.count:,}" for r in rows if r not in failing))
    if unused:
        notes.append("--allow-fallback " + ", ".join(unused) + " matched no fallback")
    calls = sum(r.count for r in failing)
    if failing:
        why = (f"{count(len(failing), 'op')} ran on the CPU ({count(calls, 'call')}): "
               + "; ".join(op_line(r) for r in failing)
               + " (exempt one with --allow-fallback OP)")
    else:
        why = "no CPU fallbacks" if not rows else "only allowed CPU fallbacks"
    blamed = [r.title for r in reports
              if any(o.kind in OFF_DEVICE and not exempt(o.op) for o in r.fallbacks)]
    limit = "no CPU fallbacks" + (f" except {', '.join(allowed)}" if allowed else "")
    measured = f"{count(calls, 'call')} of {count(len(failing), 'op')} not allowed"
    if not failing:
        measured = f"{count(sum(r.count for r in rows), 'allowed call')}, no other" if rows else "none"
    return GateResult("--fail-on-fallback", not failing, "; ".join([why, *notes]), limit, measured, blamed)


def memory_gate(reports: list[Report], limit: int) -> GateResult:
    """Fails when a cell's peak exceeds ``limit``; blames the cells whose own allocations took memory over it.

    A cell is blamed when the device memory at its start was within the limit and its peak was above it
    (``before <= limit < peak``): what it allocated crossed the line. A cell that starts above the limit,
    because earlier cells' tensors fill the device, is named as over the limit but not blamed: the cell
    that crossed is. A cell that did not touch the device (``%neuron mode``, ``print``) is not named at all, unless
    no cell that did is over the limit.
    """
    name = f"--max-peak-memory {format_size(limit)}"
    top = max(reports, key=lambda r: r.memory.peak, default=None)
    measured = f"{format_size(top.memory.peak)} in {top.title}" if top is not None else "no cell reported"
    over = [r for r in reports if r.memory.peak > limit]
    over = [r for r in over if r.touched_device] or over
    if not over:
        peak = top.memory.peak if top is not None else 0
        return GateResult(name, True, f"the highest peak was {format_size(peak)}", format_size(limit), measured)
    crossed = [r for r in over if r.memory.before <= limit]
    already = [r for r in over if r.memory.before > limit]
    parts = []
    if crossed:
        parts.append(f"{count(len(crossed), 'cell')} took it above the limit: " + ", ".join(
            f"{r.title} {format_size(r.memory.before)} → {format_size(r.memory.peak)}" for r in crossed))
    if already:
        parts.append(f"{count(len(already), 'cell')} started above it (not blamed): "
                     + ", ".join(f"{r.title} {format_size(r.memory.before)} at its start" for r in already))
    return GateResult(name, False, "; ".join(parts), format_size(limit), measured, [r.title for r in crossed])


def graph_break_gate(reports: list[Report]) -> GateResult:
    breaks = [b for r in reports for b in r.compiles.breaks]
    if not breaks:
        return GateResult("--fail-on-graph-break", True, "no graph breaks", "no graph breaks", "0 graph breaks")
    where = "; ".join(f"{called_at(b.site, b.via)} ({b.reason})" for b in breaks)
    return GateResult("--fail-on-graph-break", False, f"{count(len(breaks), 'graph break')}: {where}",
                      "no graph breaks", count(len(breaks), "graph break"),
                      [r.title for r in reports if r.compiles.breaks])


def kind_gate(reports: list[Report], kind: str, name: str) -> GateResult:
    """Fails on any call the reports list under ``kind`` (not supported on TorchNeuron, may abort the process on
    it), naming each with its first line and why."""
    title, call = KINDS[kind].title, KINDS[kind].call
    limit = f"no calls {title}"
    rows = [r for r in merge_rows(reports) if r.kind == kind]
    if not rows:
        return GateResult(name, True, limit, limit, "none")
    calls = sum(r.count for r in rows)
    why = f"{count(calls, call)} of {count(len(rows), 'op')}: " + "; ".join(f"{op_line(r)} ({r.why})" for r in rows)
    return GateResult(name, False, why, limit, count(calls, "call"),
                      [r.title for r in reports if any(o.kind == kind for o in r.ops_not_native)])
