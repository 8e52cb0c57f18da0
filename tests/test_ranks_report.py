"""The multi-rank report (``neuron_lab.report.ranks``): what every renderer shows for one window on several ranks."""

from __future__ import annotations

import json

from neuron_lab.kinds import COLLECTIVE, FALLBACK
from neuron_lab.report.model import Memory, OpRow, Report, Site, SiteCount
from neuron_lab.report.ranks import RankResult, RanksReport, Stuck

MiB = 1 << 20


def _rank(rank: int, wall_s: float, peak: int, fallbacks: int = 0) -> Report:
    line = SiteCount(Site("<ipython-input-7>", 3, "dist.all_reduce(x)", cell=7), 4)
    rows = [OpRow("c10d::all_reduce.sum", COLLECTIVE, "", 4, 2_000_000 * (rank + 1), ((256,),), ("float32",),
                  [line], nbytes=4096, ranks=3)]
    if fallbacks:
        rows.append(OpRow("aten::atan2.out", FALLBACK, "no kernel", fallbacks, 1_000_000, ((4,),), ("float32",),
                          [SiteCount(Site("<ipython-input-7>", 2, "y = x.atan2(x)", cell=7), fallbacks)]))
    return Report("In[7]", 7, f"neuron:{rank}", "default", "emulator", wall_s=wall_s, ops=10,
                  memory=Memory(0, MiB, peak, 24 << 30), ops_not_native=rows)


def _three_ranks() -> RanksReport:
    return RanksReport("In[7]", [RankResult(0, _rank(0, 0.5, 2 * MiB), where="engine 0"),
                                 RankResult(1, _rank(1, 0.75, 3 * MiB, fallbacks=2), where="engine 1"),
                                 RankResult(2, None, "engine 2 died (exit code -9)", "engine 2")])


def test_the_text_names_the_slowest_rank_the_skew_and_each_ranks_facts() -> None:
    text = str(_three_ranks()).splitlines()
    assert text[0] == ("neuron_lab In[7] · 3 ranks · slowest rank 1 (750.0 ms, skew 250.0 ms) · 8 collective calls · "
                       "2 CPU fallback calls · 1 rank failed (2)")
    assert text[1].split() == ["rank", "device", "time", "memory", "peak", "fallbacks", "collectives", "error"]
    assert text[2].split() == ["0", "neuron:0", "500.0", "ms", "1.00", "MiB", "2.00", "MiB", "0", "4", "calls,", "4.00",
                               "KiB,", "2.0", "ms"]
    assert text[3].split()[:2] == ["1", "neuron:1"] and text[3].split()[8] == "2"
    assert text[4].split() == ["2", "engine", "2", "died", "(exit", "code", "-9)"]
    assert text[5] == "summed over 2 ranks:"
    assert "    c10d::all_reduce.sum                   8×     6.0 ms  8.00 KiB over 3 ranks  [256] float32" in text
    assert "        at In[7] line 3: dist.all_reduce(x)  (8×)" in text


def test_html_and_json_carry_the_same_facts() -> None:
    rr = _three_ranks()
    html = rr._repr_html_()
    assert "slowest rank 1 (750.0 ms, skew 250.0 ms)" in html and "engine 2 died (exit code -9)" in html
    assert "c10d::all_reduce.sum" in html and "8.00 KiB over 3 ranks" in html
    data = json.loads(json.dumps(rr.as_dict()))
    assert (data["slowest"], data["skew_s"]) == (1, 0.25)
    back = RanksReport.from_dict(data)
    assert str(back) == str(rr)
    assert [r.report.ops_not_native[0].nbytes if r.report else None for r in back.ranks] == [4096, 4096, None]


def test_a_site_the_ranks_called_unequally_names_how_often_each_called_it() -> None:
    text = str(_three_ranks()).splitlines()  # rank 2 died: it reported nothing, and is not counted as 0
    assert "        at In[7] line 2: y = x.atan2(x) · rank 1: 2×, rank 0: 0×  (2×)" in text
    assert "        at In[7] line 3: dist.all_reduce(x)  (8×)" in text  # alike on every rank: no note
    four = RanksReport("In[7]", [RankResult(r, _rank(r, 0.5, MiB, fallbacks=3 if r == 2 else 1)) for r in range(4)])
    assert "        at In[7] line 2: y = x.atan2(x) · rank 2: 3×, ranks 0-1,3: 1×  (6×)" in str(four).splitlines()
    assert "rank 2: 3×, ranks 0-1,3: 1×" in four._repr_html_()  # every renderer shows it


def test_the_ranks_reports_read_back_name_each_line_with_one_site() -> None:
    back = RanksReport.from_dict(json.loads(json.dumps(_three_ranks().as_dict())))
    first, second = (r.report.ops_not_native[0].sites[0].site for r in back.ranks[:2])
    assert first == Site("<ipython-input-7>", 3, "dist.all_reduce(x)", cell=7)
    assert first is second  # one object per line: made once for all ranks, its texts kept once by its identity


def _stuck(told: bool = True) -> RanksReport:
    waits = {"op": "all_reduce", "group": "0", "size": 3, "shapes": [[4]], "dtypes": ["float32"]}
    at = Site("In[7]", 5, "dist.all_reduce(x)", cell=7)
    return RanksReport("In[7]", [
        RankResult(r, None, "no answer after 4 s", f"engine {r}",
                   stuck=Stuck(waits if told and r != 1 else None,
                               at if r != 1 else Site("In[7]", 3, "time.sleep(60)", cell=7), told))
        for r in range(3)])


def test_the_hang_view_names_each_collective_with_its_ranks_and_the_ranks_that_never_reached_it() -> None:
    rr = _stuck()
    assert rr.hang() == ["ranks 0,2 waiting in all_reduce (group 0 of 3 ranks, [4] float32) at In[7] line 5: "
                         "dist.all_reduce(x)",
                         "rank 1 never reached all_reduce: at In[7] line 3: time.sleep(60)"]
    assert RanksReport.from_dict(json.loads(json.dumps(rr.as_dict()))).hang() == rr.hang()
    lines = str(rr).splitlines()
    assert lines[lines.index("where the ranks were at the deadline:") + 1:][:2] == ["  " + x for x in rr.hang()]


def test_a_backend_that_does_not_tell_its_collectives_shows_only_the_lines() -> None:
    assert _stuck(told=False).hang() == ["ranks 0,2 at In[7] line 5: dist.all_reduce(x)",
                                         "rank 1 at In[7] line 3: time.sleep(60)"]
