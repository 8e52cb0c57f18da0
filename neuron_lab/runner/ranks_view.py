"""What ``neuron-lab run --nproc N`` shows of its ranks: a line per cell across ranks, the merged summary, the
reports its gates judge, its ``--json`` document and the head of its ``--html`` page.

Every fact comes from the lead's multi-rank model (``report.ranks.RanksReport``): cell k on every rank is
one RanksReport, the run is one more whose rank reports are each rank's cells merged, and both render
with the model's own text and HTML renderers.
"""

from __future__ import annotations

import argparse
from html import escape
from typing import Any

from neuron_lab.report.aggregate import merge_reports
from neuron_lab.report.html import render_ranks_html
from neuron_lab.report.model import Report
from neuron_lab.report.ranks import RankResult, RanksReport
from neuron_lab.report.ranks_rows import HANG_HEAD, ranks_summary_parts
from neuron_lab.report.text import render_ranks_text
from neuron_lab.runner import export, progress
from neuron_lab.runner.execute import Outcome
from neuron_lab.runner.gates import GateResult
from neuron_lab.runner.inputs import Program
from neuron_lab.runner.page import CSS, gates_table
from neuron_lab.runner.ranks import RanksOutcome, stdout
from neuron_lab.runner.records import DIED, FAILED, NOT_RUN, OK, STOPPED, CellRecord, as_rank, error_line
from neuron_lab.units import count, format_seconds

INDENT = progress.INDENT
TROUBLE = (*FAILED, DIED, STOPPED)  # a rank's cell that did not finish


def layout(world: int, nnodes: int) -> str:
    """The command line's ranks: ``--nproc 4``, or ``--nnodes 2 --nproc-per-node 2``."""
    return f"--nproc {world}" if nnodes == 1 else f"--nnodes {nnodes} --nproc-per-node {world // nnodes}"


def starting(program: Program, nproc: int, nnodes: int = 1) -> str:
    n = len(program.code_cells)
    hosts = f" ({count(nnodes, 'emulated host')} × {nproc // nnodes})" if nnodes > 1 else ""
    return (f"neuron-lab run {program.path} ({program.kind}, {count(n, 'code cell')}) on {count(nproc, 'rank')}"
            f"{hosts}: starting {count(nproc, 'kernel')}")


def ready(rank: int, info: dict[str, Any]) -> str:
    return f"rank {rank} {progress.ready(info)}"


def _problem(rec: CellRecord) -> str | None:
    """Why rank's cell has no clean report: its error, unless the report says it already."""
    if rec.status == NOT_RUN:
        return "not run"
    if rec.status == OK or rec.error is None:
        return None
    report = rec.as_report()
    if report is not None and report.error:
        return None
    return error_line(rec.error)


def _where(outcome: Outcome) -> str:
    return f"kernel pid {outcome.pid}" if outcome.pid else ""


def window(outcome: RanksOutcome, number: int) -> RanksReport:
    """Cell ``number`` on every rank as one RanksReport, titled as the cell's reports are."""
    records = outcome.cell(number)
    title = next((rec.label for rec in records if rec.report is not None), records[0].label)
    stuck = outcome.stuck if number == outcome.hung else {}
    return RanksReport(title, [RankResult(r, rec.as_report(), _problem(rec), _where(o), outcome.hosts[r], stuck.get(r),
                                          rec.status == STOPPED)
                               for r, (rec, o) in enumerate(zip(records, outcome.ranks, strict=True))])


def status(records: list[CellRecord]) -> str:
    """``ok`` when every rank's cell did; else each rank's that did not: ``error on rank 1, stopped on rank 0``."""
    bad = [(r, rec.status) for r, rec in enumerate(records) if rec.status != OK]
    bad.sort(key=lambda x: (x[1] != DIED, x[1] == STOPPED))  # the likely cause first: a death, then an error
    return ", ".join(f"{s} on rank {r}" for r, s in bad) or OK


def cell(outcome: RanksOutcome, number: int, total: int) -> list[str]:
    """``[2/3] train.py:5 ok 1.20 s · 4 ranks · slowest rank 2 (1.20 s, skew 0.30 s) · 8 collective calls ...``,
    then what the ranks printed (collapsed across ranks), the rank table when a rank touched the device or failed,
    then each failed rank's traceback."""
    records, rr = outcome.cell(number), window(outcome, number)
    head = " · ".join(ranks_summary_parts(rr))
    slowest = max(rec.seconds for rec in records)
    lines = [f"[{records[0].number}/{total}] {rr.title} {status(records)} {format_seconds(slowest)} · {head}"]
    lines += [INDENT + line for line in stdout(outcome.notebook.cells[records[0].index])]
    if any(rec.touched_device or rec.status in TROUBLE for rec in records):
        lines += [INDENT + line for line in render_ranks_text(rr).splitlines()[1:]]
    for r, rec in enumerate(records):
        if rec.status in FAILED and rec.error and rec.error.get("traceback"):
            lines.append(f"{INDENT}rank {r}:")
            lines += [INDENT * 2 + line for line in rec.error["traceback"].splitlines()]
    return lines


def whole_run(program: Program, outcome: RanksOutcome) -> RanksReport:
    """The run as one window per rank: each rank's cells merged, its first failure or kernel error as its error."""
    results = []
    for r, o in enumerate(outcome.ranks):
        reports = [rep for rep in (c.as_report() for c in o.cells) if rep is not None]
        bad = next((c for c in o.cells if c.status in TROUBLE), None)
        error = o.kernel_error
        if bad is not None and bad.error:
            error = f"{bad.error['ename']} in {bad.label}" + (f": {bad.error['evalue']}" if bad.error["evalue"] else "")
        results.append(RankResult(r, merge_reports(reports) if reports else None, error, _where(o), outcome.hosts[r],
                                  stopped=bad is not None and bad.status == STOPPED))
    return RanksReport(str(program.path), results)


def summary(program: Program, outcome: RanksOutcome) -> list[str]:
    """The merged summary: cells run, the run's rank table and all ranks' rows, each rank's failed cell, what did
    not run (a kernel that failed is said after the gates, with its stderr)."""
    cells = len(program.code_cells)
    ran = max((sum(c.status != NOT_RUN for c in o.cells) for o in outcome.ranks), default=0)
    lines = [f"summary: {ran} of {count(cells, 'cell')} ran on {count(len(outcome.ranks), 'rank')} in "
             f"{format_seconds(outcome.seconds)} (kernel starts included)"]
    lines += [f"  {line}" for line in render_ranks_text(whole_run(program, outcome)).splitlines()]
    errors = [f"  {rec.status} on rank {r} in {rec.label} [{rec.number}/{cells}]: {error_line(rec.error)}"
              for r, o in enumerate(outcome.ranks) for rec in o.cells if rec.status in TROUBLE and rec.error]
    lines += errors or ["  errors: none"]
    if ran < cells:
        lines.append(f"  not run: {count(cells - ran, 'cell')} ([{ran + 1}/{cells}]"
                     + (f" to [{cells}/{cells}])" if ran + 1 < cells else ")"))
    return lines


def hang(outcome: RanksOutcome) -> list[str]:
    """The hang view of the cell that ran past ``--timeout`` (the model's, as ``%%neuron ranks`` shows it); [] when
    none did."""
    return [] if outcome.hung is None else window(outcome, outcome.hung).hang()


def hang_said(outcome: RanksOutcome, total: int, timeout: float) -> list[str]:
    """What stderr says of a hang: the cell, that every rank in it was interrupted, and where each rank was."""
    label = outcome.cell(outcome.hung)[0].label
    return [f"neuron-lab run: [{outcome.hung}/{total}] {label} ran past --timeout {timeout:g} s; every rank still "
            f"in it was interrupted. {HANG_HEAD}:", *(INDENT + line for line in hang(outcome))]


def gate_reports(outcome: RanksOutcome) -> list[Report]:
    """Every rank's cell reports, cell by cell, each titled ``rank R <cell>`` so a gate blames the rank too."""
    out = []
    for k in range(1, len(outcome.ranks[0].cells) + 1):
        for r, rec in enumerate(outcome.cell(k)):
            report = rec.as_report()
            if report is not None:
                out.append(as_rank(report, r))
    return out


def document(args: argparse.Namespace, program: Program, outcome: RanksOutcome, checked: list[GateResult],
             code: int) -> dict[str, Any]:
    """The ``--json`` file: per cell, its RanksReport (``as_dict``) and each rank's status, time and error; the run
    as one RanksReport; the gates; the exit code and each rank's kernel failure."""
    n = len(program.code_cells)
    cells = []
    for k in range(1, n + 1):
        records = outcome.cell(k)
        rr = window(outcome, k)
        cells.append({"number": k, "label": rr.title, "status": status(records), "ranks": rr.as_dict(),
                      "records": [{"rank": r, **{key: v for key, v in rec.as_dict().items() if key != "report"}}
                                  for r, rec in enumerate(records)]})
    return {"schema": export.SCHEMA, "input": str(program.path), "kind": program.kind, "nproc": len(outcome.ranks),
            "backend": [o.info for o in outcome.ranks],
            "options": {k: v for k, v in vars(args).items() if k not in ("path", "func", "command")},
            "cells": cells, "summary": {"seconds": round(outcome.seconds, 3), "failure": outcome.failure,
                                        "hang": None if outcome.hung is None else {"cell": outcome.hung,
                                                                                   "lines": hang(outcome)},
                                        "ranks": whole_run(program, outcome).as_dict()},
            "gates": [g.as_dict() for g in checked], "exit_code": code,
            "kernel_errors": [{"rank": r, "error": why, "kernel_stderr": outcome.ranks[r].kernel_stderr}
                              for r, why in outcome.kernel_errors]}


def head(title: str, verdict: str, program: Program, outcome: RanksOutcome, checked: list[GateResult]) -> str:
    """The ``--html`` page's head: the verdict, the run's rank table, the gates, then each cell's rank table."""
    parts = [CSS, '<section class="neuron-lab-run">', f"<h2>{escape(title)}</h2>", f"<p>{escape(verdict)}</p>",
             render_ranks_html(whole_run(program, outcome)),
             gates_table(checked) if checked else "<p>gates: none enabled</p>"]
    for k in range(1, len(program.code_cells) + 1):
        records = outcome.cell(k)
        if any(rec.status != NOT_RUN for rec in records):
            parts.append(f"<h3>[{k}/{len(program.code_cells)}] {escape(status(records))}</h3>")
            parts.append(render_ranks_html(window(outcome, k)))
    parts.append("<p>The cells below are rank 0's; their printed lines are every rank's, collapsed.</p></section>")
    return "\n".join(parts)
