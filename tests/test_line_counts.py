"""Calls counted by line: past a line's first call the compiled core counts further calls there itself, handing the
subscriber only those of its first calls whose frames are new (the pure-Python core hands every call to the
subscriber); either way a report has every call at its line with the same stacks, live reads see them mid-window, and
work excluded from a window is not counted."""

from __future__ import annotations

import gc
import sys
import weakref

import torch
from shells import loaded_shell, run

import neuron_lab
from neuron_lab.backend.emulator import runtime
from neuron_lab.extension import session_of
from neuron_lab.trace.ops import OpTrace
from neuron_lab.trace.tracker import Tracker


def _sites(report, op="aten::atan2.out"):
    (row,) = [r for r in report.fallbacks if r.op == op]
    return row, {s.site.line: s for s in row.sites}


def _twice(x):
    return torch.atan2(x, x), torch.atan2(x, x)  # two calls of one line: two instructions, one site


def test_every_call_is_counted_at_its_line_with_at_most_stack_limit_stacks() -> None:
    x = torch.randn(4, device="neuron")
    with neuron_lab.track(stack_limit=2) as report:
        for _ in range(40):
            torch.atan2(x, x); here = sys._getframe().f_lineno  # noqa: E702
        for _ in range(9):
            _twice(x)
    row, sites = _sites(report)
    twice = _twice.__code__.co_firstlineno + 1
    assert (row.count, row.unattributed) == (58, 0)
    assert {line: s.count for line, s in sites.items()} == {here: 40, twice: 18}
    assert all(1 <= len(s.stacks) <= 2 for s in sites.values())


def _once(x):
    return torch.atan2(x, x)


def test_a_lines_repeated_frames_reach_the_subscriber_once_and_its_stacks_stay_the_same(monkeypatch) -> None:
    handed = []
    record = OpTrace.record

    def counted(self, event, args, kwargs):
        handed.append(event.name)
        return record(self, event, args, kwargs)

    monkeypatch.setattr(OpTrace, "record", counted)  # bound as the tracker subscribes
    x = torch.randn(4, device="neuron")
    with neuron_lab.track(stack_limit=3) as report:
        for i in range(40):
            if i < 2:
                _once(x); first = sys._getframe().f_lineno  # noqa: E702
            else:
                _once(x); then = sys._getframe().f_lineno  # noqa: E702
    row, sites = _sites(report)
    assert (row.count, list(sites)) == (40, [_once.__code__.co_firstlineno + 1])
    callers = [int(st[0].split(" in ")[0].rsplit(":", 1)[1]) for st in sites[_once.__code__.co_firstlineno + 1].stacks]
    assert callers == [first, then]  # the 2nd call repeats the 1st's frames; the 3rd's are new
    # the compiled core hands over the 1st and the 3rd call (new frames), and counts the rest at the line
    assert len(handed) == (2 if runtime.get().core == "compiled" else 40)


def test_live_reads_see_every_call_so_far_and_excluded_work_is_not_counted() -> None:
    x = torch.randn(4, device="neuron")
    t = Tracker().start()
    try:
        for _ in range(30):
            torch.atan2(x, x)
        assert t.live()[0] == 30
        with t.excluded():
            for _ in range(20):
                torch.atan2(x, x)
        for _ in range(5):
            torch.atan2(x, x)
        assert [r.count for r in t.rows_so_far() if r.op == "aten::atan2.out"] == [35]
    finally:
        report = t.stop()
    row, sites = _sites(report)
    assert row.count == 35 and sum(s.count for s in sites.values()) == 35


def test_nested_windows_each_count_every_call() -> None:
    x = torch.randn(4, device="neuron")
    with neuron_lab.track() as outer:
        for _ in range(10):
            torch.atan2(x, x)
        with neuron_lab.track() as inner:
            for _ in range(10):
                torch.atan2(x, x)
        for _ in range(10):
            torch.atan2(x, x)
    assert _sites(outer)[0].count == 30 and _sites(inner)[0].count == 10


def test_a_backward_fallback_on_autograds_thread_is_counted_at_the_line_the_main_thread_waits_on() -> None:
    x = torch.rand(8, 3, device="neuron", requires_grad=True)
    with neuron_lab.track() as report:
        for _ in range(12):
            y = torch.linalg.cross(x, x * 2).sum(); forward = sys._getframe().f_lineno  # noqa: E702
            y.backward(); backward = sys._getframe().f_lineno  # noqa: E702
    row, sites = _sites(report, "aten::linalg_cross.out")
    assert {line: s.count for line, s in sites.items()} == {forward: 12, backward: 24}
    assert row.unattributed == 0


def test_without_call_sites_every_call_is_counted_in_its_row() -> None:
    x = torch.rand(8, 3, device="neuron", requires_grad=True)
    with neuron_lab.track(callsites=False) as report:
        for _ in range(15):
            torch.linalg.cross(x, x * 2).sum().backward()
            torch.atan2(x, x)
    cross, sites = _sites(report, "aten::linalg_cross.out")
    assert (cross.count, cross.unattributed, sites) == (45, 45, {})
    assert _sites(report)[0].count == 15


def test_after_unload_nothing_holds_the_sessions_locator() -> None:
    """The core keeps the roles it learnt while the roles callback stays the same (cell after cell), but not the
    callback itself once nobody subscribes: after ``%unload_ext`` the session's locator (and the cells' code objects
    it judged) go with the session."""
    with loaded_shell() as sh:
        run(sh, "import torch\nx = torch.randn(4, device='neuron')\ny = torch.atan2(x, x)")
        locator = weakref.ref(session_of(sh).locator)
    gc.collect()
    assert locator() is None
