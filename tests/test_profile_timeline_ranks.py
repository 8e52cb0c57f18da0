"""Several ranks' profiled windows as one timeline (issue 19, `%%neuron ranks --profile`): a set of lanes per rank
named with its rank, every rank's times on the clock they share, the cap over all of them, and the ranks report's
round trip with its timeline. Pure data: the ranks themselves are in ``test_ranks.py``."""

from __future__ import annotations

import json
from dataclasses import asdict

from neuron_lab.kinds import FALLBACK
from neuron_lab.report.model import COPY, HOST_LANE, KERNEL, Report
from neuron_lab.report.ranks import RankResult, RanksReport
from neuron_lab.report.text import timeline_lines
from neuron_lab.trace.profile_timeline import build, merge_ranks

T0 = 1_764_800_000_000_000_000  # a window's start: wall-clock ns since the epoch, as Kineto gives it


def _window(start: int, rank: int) -> object:
    """One rank's window: a matmul and a copy on its device, a CPU fallback on the host, 4 KiB allocated (times in
    µs after ``start``)."""
    dev, us = f"neuron:{rank}", 1000
    return build(start, {dev: [(start + 100 * us, start + 400 * us, "aten::mm", KERNEL),
                               (start + 900 * us, start + 950 * us, "Memcpy DtoH", COPY)],
                         HOST_LANE: [(start + 500 * us, start + 800 * us, "aten::atan2", FALLBACK)]},
                 {dev: [(start + 50 * us, 4096), (start + 990 * us, -4096)]}, {dev: 1024})


def test_each_rank_has_its_lanes_named_with_its_rank_on_the_earliest_windows_clock() -> None:
    zero, one = _window(T0, 0), _window(T0 + 2_000_000, 1)  # rank 1's window began 2 ms later
    tl = merge_ranks({1: one, 0: zero})
    us = 1000
    assert [x.name for x in tl.lanes] == ["rank 0 neuron:0", "rank 0 host", "rank 1 neuron:1", "rank 1 host"]
    assert [m.device for m in tl.memory] == ["rank 0 neuron:0", "rank 1 neuron:1"]
    assert tl.start_ns == T0 and tl.duration_ns == (2_000 + 990) * us
    starts = {x.name: [(s.start_ns // us, s.dur_ns // us, s.name) for s in x.spans] for x in tl.lanes}
    assert starts["rank 0 neuron:0"] == [(100, 300, "aten::mm"), (900, 50, "Memcpy DtoH")]
    assert starts["rank 1 neuron:1"] == [(2_100, 300, "aten::mm"), (2_900, 50, "Memcpy DtoH")]
    assert starts["rank 1 host"] == [(2_500, 300, "aten::atan2")]
    assert tl.memory[1].points == [(2_000 * us, 1024), (2_050 * us, 5120), (2_990 * us, 1024)]
    assert (tl.events, tl.merged, tl.dropped) == (6, 0, 0)
    assert [s.start_ns for s in one.lanes[0].spans] == [100 * us, 900 * us]  # each rank's own timeline is unchanged
    assert timeline_lines(tl) == ["timeline: 3.0 ms, 4 lanes, 6 events",
                                  "  rank 0 neuron:0: 2 events, busy 350 µs", "  rank 0 host: 1 event, busy 300 µs",
                                  "  rank 1 neuron:1: 2 events, busy 350 µs", "  rank 1 host: 1 event, busy 300 µs",
                                  "  rank 0 neuron:0 memory: 1.00 KiB at the start, peak 5.00 KiB, 1.00 KiB at the end",
                                  "  rank 1 neuron:1 memory: 1.00 KiB at the start, peak 5.00 KiB, 1.00 KiB at the end"]


def test_a_rank_without_a_profile_has_no_lanes() -> None:
    tl = merge_ranks({0: _window(T0, 0), 2: _window(T0 + 10_000, 2)})
    assert [x.name for x in tl.lanes] == ["rank 0 neuron:0", "rank 0 host", "rank 2 neuron:2", "rank 2 host"]
    assert merge_ranks({}).lanes == []


def test_the_cap_holds_over_all_ranks_and_every_event_is_accounted_for() -> None:
    tl = merge_ranks({0: _window(T0, 0), 1: _window(T0, 1)}, max_spans=4)
    spans = [s for x in tl.lanes for s in x.spans]
    assert len(spans) <= 4
    assert sum(s.events for s in spans) + tl.dropped == tl.events == 6
    assert tl.merged == 6 - len(spans) - tl.dropped


def test_a_ranks_report_round_trips_with_its_timeline_and_merged_trace() -> None:
    tl = merge_ranks({0: _window(T0, 0), 1: _window(T0 + 7_000, 1)})
    rr = RanksReport("In[3]", [RankResult(0, Report("In[3]", 3, "neuron:0", "default", "emulator")),
                               RankResult(1, error="engine 1 died (pid 42)", where="engine 1 (pid 42)")],
                     timeline=tl, trace_path="/tmp/ranks.json")
    back = RanksReport.from_dict(json.loads(json.dumps(rr.as_dict())))
    assert asdict(back.timeline) == asdict(tl) and back.trace_path == "/tmp/ranks.json"
    assert RanksReport.from_dict(json.loads(json.dumps(RanksReport("x").as_dict()))).timeline is None
