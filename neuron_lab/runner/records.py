"""One executed cell as the runner keeps it: its status, time, error, and its report as the kernel sent it, with the
windows a ``%%neuron ranks`` cell ran on the ranks."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from neuron_lab.report.model import Report
from neuron_lab.report.ranks import STOPPED as STOPPED  # one of several ranks: ended because another rank failed
from neuron_lab.report.ranks import RanksReport

OK, ERROR, TIMEOUT, INTERRUPTED = "ok", "error", "timeout", "interrupted"
DIED, NOT_RUN = "kernel died", "not run"
FAILED = (ERROR, TIMEOUT, INTERRUPTED)  # the cell ran and did not finish: its error is kept


@dataclass
class CellRecord:
    index: int  # position in the notebook (0-based, markdown cells included)
    number: int  # 1-based among the cells that execute: the [k/n] of the progress line
    status: str = NOT_RUN
    execution_count: int | None = None
    seconds: float = 0.0
    report: dict[str, Any] | None = None  # Report.as_dict(), from the kernel
    text: str | None = None  # the extension's text rendering of that same Report
    touched_device: bool = False
    error: dict[str, Any] | None = None  # {"ename", "evalue", "traceback"}
    where: str | None = None  # a script chunk's "path:line", known before the cell runs
    trace: str | None = None  # the Chrome trace this cell wrote (--trace; one rank's with --nproc)
    no_trace: str | None = None  # --trace: why this cell wrote none ("the cell ran its own profiler")
    ranks: list[dict[str, Any]] = field(default_factory=list)  # a %%neuron ranks cell's windows (RanksReport.as_dict())

    @property
    def label(self) -> str:
        """How messages name the cell: its report's title (``In[3]``, ``train.py:12``), else the best guess.

        A fresh kernel numbers the cells it runs 1, 2, ..., so a cell that died before reporting is ``In[number]``.
        """
        if self.report is not None:
            return self.report["title"]
        return self.where or f"In[{self.execution_count or self.number}]"

    def as_dict(self) -> dict[str, Any]:
        return {"index": self.index, "number": self.number, "label": self.label,
                "execution_count": self.execution_count, "status": self.status, "seconds": round(self.seconds, 4),
                "touched_device": self.touched_device, "report": self.report, "error": self.error,
                "trace": self.trace, "no_trace": self.no_trace, "ranks": self.ranks}

    def as_report(self) -> Report | None:
        return None if self.report is None else Report.from_dict(self.report)

    def windows(self) -> list[RanksReport]:
        """The windows the cell ran on the ranks (a ``%%neuron ranks`` cell's one), in the order they ran."""
        return [RanksReport.from_dict(w) for w in self.ranks]

    def judged(self) -> list[Report]:
        """The reports the run judges for this cell: its own, then each rank's of its ranks windows."""
        own = self.as_report()
        return [*([] if own is None else [own]),
                *(as_rank(r.report, r.rank) for w in self.windows() for r in w.ranks if r.report is not None)]


def error_line(error: dict[str, Any]) -> str:
    """``ValueError: bad shard``, the error as one line: a message's first line where it runs over several (dynamo's
    explanation and hints, argparse's usage), which the traceback and the JSON keep whole; ``KeyboardInterrupt`` alone
    when it says nothing more."""
    first = error.get("evalue", "").strip().partition("\n")[0].rstrip()
    return f"{error['ename']}: {first}" if first else error["ename"]


def as_rank(report: Report, rank: int) -> Report:
    """A rank's report titled ``rank R <cell>``, so that a gate or the summary names the rank too."""
    return replace(report, title=f"rank {rank} {report.title}")
