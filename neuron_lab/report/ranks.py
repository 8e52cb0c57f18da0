"""One window run on several ranks (a ``%%neuron ranks`` cell, a ``neuron-lab run --nproc`` script): each rank's own
:class:`Report`, or what stopped it, and the facts only the ranks together have (the slowest rank, the skew).

The per-rank reports are ordinary reports, so every single-rank renderer, gate and JSON reader applies to each;
this model adds the comparison across ranks and nothing else. A profiled window (``%%neuron ranks --profile``) keeps
each rank's profile on its report and adds the ranks' timelines merged into one, with one set of lanes per rank.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from neuron_lab.kinds import COLLECTIVE, UNSUPPORTED
from neuron_lab.report.aggregate import merge_rows
from neuron_lab.report.model import OpRow, ProfiledTimeline, Report, Site
from neuron_lab.units import ShownAsText

STOPPED = "stopped"  # a rank ended because another rank failed: said apart from the ranks that failed


@dataclass(frozen=True)
class Stuck:
    """Where a rank was, asked while it was stuck past the cell's deadline: the collective it waited in (None: in
    none) and the notebook line it was at (None: outside any cell's code)."""

    collective: dict[str, Any] | None  # {"op", "group", "size", "shapes", "dtypes"}, as the backend says it
    site: Site | None
    told: bool = True  # the backend tells which collective a rank is in (the emulator's group does; TorchNeuron's not)

    @property
    def op(self) -> str | None:
        return None if self.collective is None else self.collective["op"]

    @property
    def waits_in(self) -> str:
        """``all_reduce (group default of 2 ranks, [4] float32)``; "" when in none."""
        c = self.collective
        if c is None:
            return ""
        tensors = ", ".join(f"[{', '.join(map(str, shape))}] {dtype}"
                            for shape, dtype in zip(c["shapes"], c["dtypes"], strict=True))
        return f"{c['op']} (group {c['group']} of {c['size']} ranks{', ' + tensors if tensors else ''})"

    @property
    def at(self) -> str:
        """``In[3] line 4: dist.all_reduce(t)``, or where it is not in a cell."""
        s = self.site
        return "outside the cell's code" if s is None else f"{s.label}: {s.source}" if s.source else s.label

    @property
    def text(self) -> str:
        if self.collective:
            return f"waiting in {self.waits_in} at {self.at}"
        return f"in no collective, at {self.at}" if self.told else f"at {self.at}"

    def as_dict(self) -> dict[str, Any]:
        return {"collective": self.collective, "site": None if self.site is None else asdict(self.site),
                "told": self.told}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Stuck:
        return cls(d["collective"], None if d["site"] is None else Site(**d["site"]), d.get("told", True))


@dataclass
class RankResult:
    """What one rank did: its report, or why there is none (it died, or never answered)."""

    rank: int
    report: Report | None = None
    error: str | None = None  # "exit code -9 (killed)", "ValueError: bad shape", "no answer after 60 s"
    where: str = ""  # the process: "engine 2 (pid 4242)", "pid 4242"
    host: str = ""  # the host it ran on (an emulated host's name on an emulated cluster)
    stuck: Stuck | None = None  # past the deadline: where it was stuck, as it said then
    stopped: bool = False  # ended because another rank failed: its error says so, and it is not counted as failed

    @property
    def failed(self) -> bool:
        return self.report is None or self.report.error is not None or self.error is not None

    @property
    def problem(self) -> str | None:
        """The rank's error in one line: its own, or its report's."""
        return self.error or (self.report.error if self.report is not None else None)

    def collectives(self) -> tuple[int, int, int]:
        """Calls, bytes and nanoseconds of its collectives (summed in one pass: the summary and the rank table each
        ask, for every rank)."""
        calls = nbytes = ns = 0
        for r in self.report.ops_not_native if self.report else ():
            if r.kind == COLLECTIVE:
                calls, nbytes, ns = calls + r.count, nbytes + r.nbytes, ns + r.host_ns
        return calls, nbytes, ns

    def unsupported_calls(self) -> int:
        return sum(r.count for r in self.report.ops_not_native if r.kind == UNSUPPORTED) if self.report else 0


@dataclass
class RanksReport(ShownAsText):
    """The same window on every rank, in rank order."""

    title: str  # "In[5]", "train.py"
    ranks: list[RankResult] = field(default_factory=list)
    timeline: ProfiledTimeline | None = None  # profiled: the ranks' timelines on one clock, lanes named "rank R ..."
    trace_path: str | None = None  # profiled with an export: the ranks' Chrome traces merged, one process per rank

    @property
    def reports(self) -> list[Report]:
        """The reports the ranks gave back, in rank order (failed ranks without one left out)."""
        return [r.report for r in self.ranks if r.report is not None]

    @property
    def slowest(self) -> RankResult | None:
        """The rank whose window took longest: the one the others waited for at their next collective."""
        done = [r for r in self.ranks if r.report is not None]
        return max(done, key=lambda r: r.report.wall_s, default=None)

    @property
    def skew_s(self) -> float:
        """Slowest minus fastest wall time over the ranks that reported."""
        walls = [r.wall_s for r in self.reports]
        return max(walls) - min(walls) if walls else 0.0

    @property
    def failed(self) -> list[RankResult]:
        """The ranks without a clean report: those that failed and those stopped because one did."""
        return [r for r in self.ranks if r.failed]

    @property
    def stopped(self) -> list[RankResult]:
        """The ranks ended because another rank failed (not failed themselves)."""
        return [r for r in self.ranks if r.stopped]

    @property
    def table_rank(self) -> RankResult | None:
        """The first rank with a profile: the one whose op table and time per line are shown (the ranks run the
        same cell, so one rank's table stands for all; summing them would count each op once per rank)."""
        return next((r for r in self.ranks if r.report is not None and r.report.profiled is not None), None)

    def merged(self) -> Report:
        """The rows of every rank's report in one, a row per op and a line per call site for all ranks, counts summed;
        a site the ranks did not all call equally says which ranks called it how often (``· rank 1: 2×, rank 0:
        1×``), so the rank that differs stands out."""
        reporting = [r for r in self.ranks if r.report is not None]
        merged = merge_rows(r.report for r in reporting)
        calls: dict[tuple, dict[int, int]] = {}  # (op, kind, group size, site): rank -> calls
        for r in reporting:
            for row in r.report.ops_not_native:
                for sc in row.sites:
                    per_rank = calls.setdefault(_site_key(row, sc.site), {})
                    per_rank[r.rank] = per_rank.get(r.rank, 0) + sc.count
        ranks = [r.rank for r in reporting]
        for row in merged:
            for sc in row.sites:
                note = _ranks_note(calls[_site_key(row, sc.site)], ranks)
                if note:
                    sc.site = replace(sc.site, source=f"{sc.site.source} · {note}")
        return Report(f"{len(reporting)} ranks", None, "", "", "", ops_not_native=merged)

    def hang(self) -> list[str]:
        """Where the ranks stuck past the deadline were, in a line per collective and line: the ranks waiting in
        each collective at each line, then the ranks that never reached it at theirs ([] when none was stuck)."""
        stuck = [r for r in self.ranks if r.stuck is not None]
        alike: dict[tuple[bool, str], list[int]] = {}
        for r in stuck:
            alike.setdefault((r.stuck.collective is None and r.stuck.told, r.stuck.text), []).append(r.rank)
        ops = sorted({r.stuck.op for r in stuck if r.stuck.op})
        lines = []
        for (outside, text), ranks in sorted(alike.items(), key=lambda kv: (kv[0][0], kv[1][0])):  # by first rank
            who = ranks_named(ranks)
            lines.append(f"{who} never reached {' or '.join(ops)}: {text.removeprefix('in no collective, ')}"
                         if outside and ops else f"{who} {text}")
        return lines

    def as_dict(self) -> dict[str, Any]:
        return {"title": self.title, "slowest": self.slowest.rank if self.slowest else None, "skew_s": self.skew_s,
                "timeline": None if self.timeline is None else asdict(self.timeline), "trace_path": self.trace_path,
                "ranks": [{"rank": r.rank, "where": r.where, "error": r.error, "host": r.host,
                           "stuck": None if r.stuck is None else r.stuck.as_dict(), "stopped": r.stopped,
                           "report": None if r.report is None else r.report.as_dict()} for r in self.ranks]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RanksReport:
        return cls(d["title"], [RankResult(r["rank"], None if r["report"] is None else Report.from_dict(r["report"]),
                                           r["error"], r["where"], r.get("host", ""),
                                           None if r.get("stuck") is None else Stuck.from_dict(r["stuck"]),
                                           r.get("stopped", False))
                                for r in d["ranks"]],
                   None if d.get("timeline") is None else ProfiledTimeline.from_dict(d["timeline"]),
                   d.get("trace_path"))

    def __str__(self) -> str:
        from neuron_lab.report.text import render_ranks_text

        return render_ranks_text(self)

    def _repr_html_(self) -> str:
        from neuron_lab.report.html import render_ranks_html

        return render_ranks_html(self)


def ranks_named(ranks: list[int]) -> str:
    """``rank 1``, ``ranks 0-1``."""
    return f"{'rank' if len(ranks) == 1 else 'ranks'} {ranks_label(ranks)}"


def ranks_label(ranks: Iterable[int]) -> str:
    """``0-3``, ``0,2``, ``0-1,4``: ranks as runs of consecutive numbers."""
    return _runs(frozenset(ranks))


@functools.lru_cache(maxsize=256)
def _runs(ranks: frozenset[int]) -> str:
    """The label of a set of ranks, made once per set: every line the ranks print alike is labelled with it."""
    runs: list[list[int]] = []
    for r in sorted(ranks):
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    return ",".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)


def outliers(values: dict[int, float]) -> list[int]:
    """The ranks whose value stands apart from the others' (a loss that diverged, a NaN among numbers): further from
    the median than 3 scaled median absolute deviations and than a tenth of the median. Three ranks at least: of two,
    neither is the odd one."""
    finite = sorted([v for v in values.values() if math.isfinite(v)])
    if len(values) < 3 or len(finite) <= len(values) // 2:
        return []
    mid = statistics.median(finite)
    bound = max(3 * 1.4826 * statistics.median([abs(v - mid) for v in finite]), abs(mid) / 10)
    return sorted([rank for rank, v in values.items() if not math.isfinite(v) or abs(v - mid) > bound])


def _site_key(row: OpRow, site: Site) -> tuple[Any, ...]:
    """A call site of a row, as :func:`~neuron_lab.report.aggregate.merge_rows` tells rows and sites apart."""
    return row.op, row.kind, row.ranks, site.filename, site.line, site.cell


def _ranks_note(per_rank: dict[int, int], ranks: list[int]) -> str:
    """"" when every rank made as many calls at the site; else each count with its ranks, the most calls first."""
    if len(per_rank) == len(ranks) and len(set(per_rank.values())) == 1:  # each rank called it, as often
        return ""
    by_count: dict[int, list[int]] = {}
    for rank in ranks:
        by_count.setdefault(per_rank.get(rank, 0), []).append(rank)
    if len(by_count) == 1:
        return ""
    return ", ".join(f"{'rank' if len(rs) == 1 else 'ranks'} {ranks_label(rs)}: {n:,}×"
                     for n, rs in sorted(by_count.items(), reverse=True))
