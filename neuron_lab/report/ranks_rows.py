"""One window on several ranks (:class:`~neuron_lab.report.ranks.RanksReport`) as renderer-neutral rows and sentences:
the summary line, a row per rank, and what the profiled section shows."""

from __future__ import annotations

from dataclasses import replace

from neuron_lab import kinds
from neuron_lab.kinds import FALLBACK
from neuron_lab.report.model import Profiled
from neuron_lab.report.profiled_rows import profiled_head
from neuron_lab.report.ranks import STOPPED, RanksReport
from neuron_lab.report.rows import Table
from neuron_lab.units import count, format_seconds, format_size

HANG_HEAD = "where the ranks were at the deadline"  # the hang view's heading, over RanksReport.hang()'s lines
RANK_HEADER = ["rank", "device", "time", "memory", "peak", "fallbacks", "collectives", "error"]


def ranks_summary_parts(rr: RanksReport) -> list[str]:
    """The facts of a :class:`~neuron_lab.report.ranks.RanksReport`'s one line after its title: ranks, the slowest
    and the skew, collectives, and what any rank did off the device or failed at."""
    parts = [count(len(rr.ranks), "rank")]
    slow = rr.slowest
    if slow is not None and len(rr.reports) > 1:
        parts.append(f"slowest rank {slow.rank} ({format_seconds(slow.report.wall_s)}, skew "
                     f"{format_seconds(rr.skew_s)})")
    elif slow is not None:
        parts.append(format_seconds(slow.report.wall_s))
    calls = sum(r.collectives()[0] for r in rr.ranks)
    if calls:  # none observed says nothing on a backend that does not observe them
        parts.append(count(calls, kinds.KINDS[kinds.COLLECTIVE].call))
    fallback = sum(r.fallback_calls for r in rr.reports)
    parts.append(count(fallback, kinds.KINDS[FALLBACK].call) if fallback else "no CPU fallbacks")
    unsupported = sum(r.unsupported_calls() for r in rr.ranks)
    if unsupported:
        parts.append(count(unsupported, kinds.KINDS[kinds.UNSUPPORTED].call))
    for word, ranks in (("failed", [r for r in rr.failed if not r.stopped]), (STOPPED, rr.stopped)):
        if ranks:
            parts.append(f"{count(len(ranks), 'rank')} {word} ({', '.join(str(r.rank) for r in ranks)})")
    return parts


def ranks_summary_line(rr: RanksReport) -> str:
    return "neuron_lab " + " · ".join([rr.title, *ranks_summary_parts(rr)])


def rank_table(rr: RanksReport) -> Table:
    """A row per rank: its device, time, memory, fallbacks, collectives, or its error; its host too when the ranks
    are on several."""
    several = len({r.host for r in rr.ranks}) > 1
    out = []
    for r in rr.ranks:
        rep = r.report
        host = [r.host] if several else []
        if rep is None:
            out.append([str(r.rank), *host, "", "", "", "", "", "", r.problem or ""])
            continue
        calls, nbytes, ns = r.collectives()
        coll = f"{count(calls, 'call')}, {format_size(nbytes)}, {format_seconds(ns / 1e9)}" if calls else ""
        out.append([str(r.rank), *host, rep.device, format_seconds(rep.wall_s), format_size(rep.memory.after),
                    format_size(rep.memory.peak), f"{rep.fallback_calls:,}", coll, r.problem or ""])
    return Table([RANK_HEADER[0], *(["host"] if several else []), *RANK_HEADER[1:]], out)


def ranks_profile_heads(rr: RanksReport) -> list[str]:
    """A profiled ranks window: whose tables follow, then each rank's profile in one line, or why it has none."""
    shown = rr.table_rank
    lines = [f"profiled on {count(len(rr.ranks), 'rank')}: op table and time per line of rank {shown.rank}, the "
             "timeline of all ranks on one clock" if shown else "profiled: no rank gave back a profile"]
    for r in rr.ranks:
        p = r.report.profiled if r.report is not None else None
        lines.append(f"  rank {r.rank}: " + (profiled_head(p) if p is not None else
                                             f"no profile, no lanes ({r.problem or 'none was made'})"))
    return lines


def ranks_profile(rr: RanksReport) -> Profiled | None:
    """What the profile section below the heads shows: the table rank's op table and time per line, with the timeline
    of all ranks and the merged trace (None when the window was not profiled)."""
    if rr.timeline is None:
        return None
    shown = rr.table_rank
    p = shown.report.profiled if shown is not None else Profiled()
    return replace(p, timeline=rr.timeline, trace_path=rr.trace_path)
