"""The whole run as one window: the cells' reports merged into one :class:`Report`, plus what only a run has.

The run's Report (``report.aggregate.merge_reports``: fallbacks by op with their lines, memory, copies, compiles) is
rendered by the same text renderer as a cell's, so the summary and the cell reports read alike; its
op rows come from the fallback inspector's :func:`merge_rows`, so "3× at In[2] line 3" here is the
count the cell's own report shows. The ``%%neuron ranks`` cells' windows are one more, as ``--nproc`` shows its run:
each rank's reports merged, rendered by the ranks' renderer. The run adds which cell (or rank) reached the peak,
which cell failed, and the total time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from neuron_lab.report.aggregate import merge_reports
from neuron_lab.report.model import Memory, OpRow, Report, Site
from neuron_lab.report.ranks import RankResult, RanksReport
from neuron_lab.report.text import render_ranks_text, render_text
from neuron_lab.runner.records import DIED, FAILED, NOT_RUN, CellRecord
from neuron_lab.units import count, format_capacity, format_seconds, format_size


@dataclass
class Summary:
    cells: int  # code cells in the input
    ran: int  # cells that started (the last may have failed)
    seconds: float  # the whole run, kernel start included
    total: Report  # every cell's report merged: the run as one window
    peak_at: str | None = None  # the cell that reached the run's peak device memory ("rank 1 In[3]": a rank's)
    errors: list[CellRecord] = field(default_factory=list)  # the cell that raised, timed out or died
    ranks: RanksReport | None = None  # the %%neuron ranks cells' windows as one, each rank's reports merged
    peak_memory: Memory | None = None  # the memory of the report (a cell's, or a rank's) that reached the run's peak

    @property
    def peak(self) -> tuple[int, int | None]:
        """The run's peak device memory and the capacity it is a share of."""
        m, total = self.peak_memory or self.total.memory, self.total.memory
        return m.peak, total.capacity if total.capacity is not None else m.capacity

    def as_dict(self) -> dict[str, Any]:
        peak, capacity = self.peak
        return {"cells": self.cells, "ran": self.ran, "failures": len(self.errors), "seconds": round(self.seconds, 3),
                "fallback_calls": self.total.fallback_calls, "possible_calls": self.total.possible_calls,
                "fallbacks": [_row_dict(r) for r in self.total.fallbacks],
                "downcasts": [_row_dict(r) for r in self.total.downcasts],
                "sync_calls": self.total.sync_calls,
                "syncs": [_row_dict(r) for r in self.total.syncs],
                "peak_memory": {"bytes": peak, "cell": self.peak_at, "capacity": capacity},
                "compiles": {"graphs": self.total.compiles.graphs, "breaks": len(self.total.compiles.breaks),
                             "recompiles": len(self.total.compiles.recompiles),
                             "compile_s": round(self.total.compiles.compile_s, 4)},
                "errors": [{"cell": e.label, "number": e.number, "status": e.status, **_error(e)}
                           for e in self.errors],
                "report": self.total.as_dict(), "ranks": None if self.ranks is None else self.ranks.as_dict()}


def reports(cells: list[CellRecord]) -> list[Report]:
    """What the gates judge: every cell's report, and each rank's of the ``%%neuron ranks`` cells."""
    return [r for c in cells for r in c.judged()]


def summarize(cells: list[CellRecord], seconds: float) -> Summary:
    rs = [r for r in (c.as_report() for c in cells) if r is not None]
    peak = max(reports(cells), key=lambda r: r.memory.peak, default=None)  # the first cell that reached it
    return Summary(len(cells), sum(c.status != NOT_RUN for c in cells), seconds, merge_reports(rs),
                   peak.title if peak is not None else None,
                   [c for c in cells if c.status in (*FAILED, DIED)], ranks_cells(cells),
                   peak.memory if peak is not None else None)


def ranks_cells(cells: list[CellRecord]) -> RanksReport | None:
    """The ``%%neuron ranks`` cells' windows as one (None when the run had none): each rank's reports merged, its
    first failure as its error, as ``--nproc`` shows its whole run."""
    windows = [w for c in cells for w in c.windows()]
    if not windows:
        return None
    by_rank: dict[int, list[tuple[str, RankResult]]] = {}
    for w in windows:
        for r in w.ranks:
            by_rank.setdefault(r.rank, []).append((w.title, r))
    results = []
    for rank, said in sorted(by_rank.items()):
        rs = [r.report for _, r in said if r.report is not None]
        failed = next(((title, r.problem) for title, r in said if r.failed and r.problem), None)
        error = None
        if failed is not None:
            ename, _, evalue = failed[1].partition(": ")
            error = f"{ename} in {failed[0]}" + (f": {evalue}" if evalue else "")
        last = said[-1][1]
        results.append(RankResult(rank, merge_reports(rs) if rs else None, error, last.where, last.host))
    return RanksReport("%%neuron ranks " + ", ".join(dict.fromkeys(w.title for w in windows)), results)


def render(s: Summary) -> list[str]:
    lines = [f"summary: {s.ran} of {s.cells} cells ran in {format_seconds(s.seconds)} (kernel start included)"]
    if s.peak_at is None:
        return lines + ["  the input has no code cells" if not s.cells else "  no cell reported"] + _errors(s)
    lines += [f"  {line}" for line in render_text(s.total, "table").splitlines()]
    ranks = s.ranks.reports if s.ranks is not None else []
    if s.ranks is not None:
        lines += [f"  {line}" for line in render_ranks_text(s.ranks).splitlines()]
    if not s.total.fallbacks and not any(r.fallbacks for r in ranks):
        lines.append("  CPU fallbacks: none")
    if not s.total.compiles and not any(r.compiles for r in ranks):
        lines.append("  torch.compile: not used")
    peak, capacity = s.peak
    share = ""
    if capacity:
        share = f" ({peak / capacity:.1%})" if peak >= capacity / 1000 else " (<0.1%)"
    lines.append(f"  peak device memory: {format_size(peak)} of {format_capacity(capacity)}{share}, in {s.peak_at}")
    return lines + _errors(s)


def _errors(s: Summary) -> list[str]:
    lines = [f"  error in {e.label} [{e.number}/{s.cells}]: {_error(e)['ename']}: {_error(e)['evalue']}"
             for e in s.errors] or ["  errors: none"]
    if s.ran < s.cells:
        first = s.ran + 1
        lines.append(f"  not run: {count(s.cells - s.ran, 'cell')} ([{first}/{s.cells}]"
                     + (f" to [{s.cells}/{s.cells}])" if first < s.cells else ")"))
    return lines


def _site_dict(site: Site) -> dict[str, Any]:
    return {"at": site.label, "filename": site.filename, "line": site.line, "cell": site.cell, "source": site.source}


def _row_dict(r: OpRow) -> dict[str, Any]:
    """An op row with its sites' labels (``In[2] line 3``), for CI scripts that read the JSON."""
    return {"op": r.op, "kind": r.kind, "count": r.count, "unattributed": r.unattributed,
            "sites": [{**_site_dict(sc.site), "count": sc.count} for sc in r.sites]}


def _error(e: CellRecord) -> dict[str, str]:
    err = e.error or {}
    return {"ename": err.get("ename", "?"), "evalue": err.get("evalue", "")}
