"""Ranks on two emulated hosts (`%neuron ranks start 2 --hosts 2`) and the live dashboard across them: each rank names
its host and owns its host's first device, and a DDP and an FSDP2 step's report has each rank's host; the dashboard's
synced state (read here, in the notebook's shell, while a ``%%neuron ranks`` cell runs) has a row per rank with its
host and its own memory and CPU fallback calls, asked of the rank itself; a rank blocked in a collective says so, a
suspended one is not answering; a killed one is a lost host, which the next cell and the dashboard say, and after
``stop`` every row says stopped.

Real ipyparallel engines, started once for the module (about 20 s on a loaded 2-core machine) and shared by its tests:
the dashboard's first (it counts the ranks' own bytes), the lost host's last. Every wait is bounded: the cell waits for
the test's files at most 60 s, the test for each state at most 60 s, and the engines are killed by pid on the way out.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from IPython.core.interactiveshell import InteractiveShell
from rank_steps import DDP_AND_FSDP2, assert_ddp_and_fsdp2
from shells import loaded_shell, run
from test_ranks import _children, _gone, _kill, ranks_error

from neuron_lab.extension import session_of
from neuron_lab.session import rank_pulse
from neuron_lab.widgets import static

START = "%neuron ranks start 2 --hosts 2 --timeout 60"
WAIT_S = 60.0
CELL = """%%neuron ranks --timeout 60
import os, time, torch, torch.distributed as dist
rank = dist.get_rank()
x = torch.ones(1024 * (rank + 1), device='neuron')
y = torch.atan2(x, x)
def until(path):
    end = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < end:
        time.sleep(0.02)
until({seen!r})
if rank == 1:
    until({waited!r})
dist.all_reduce(x[:1024])
"""


_OTHERS: set[int] = set()  # this test process's children that are not the module's ranks


@pytest.fixture(scope="module")
def hosts_shell() -> Iterator[tuple[InteractiveShell, str]]:
    """IPython's singleton shell (the dashboard displays through it) with ranks 0 and 1 on host0 and host1; the
    start's output."""
    before = _children()
    _OTHERS.update(before)
    with loaded_shell(instance=True) as sh:
        try:
            _, cap = run(sh, START)
            yield sh, cap.stdout
        finally:
            _kill(_children() - before)


@pytest.fixture
def hosts(hosts_shell) -> InteractiveShell:
    """The module's shell with both ranks up and free in an unbroken group: its own, or a restart where an earlier
    test lost a host."""
    sh, _ = hosts_shell
    r = session_of(sh).ranks
    if not (r is not None and r.broken is None and all(e.alive() and e.free() for e in r.engines)):
        run(sh, START + " --restart")
    return sh


@contextlib.contextmanager
def _dashboard(sh: InteractiveShell) -> Iterator:
    """``%neuron dashboard`` as a widget panel; the shell's way of showing things put back after."""
    was = session_of(sh).config.display_as
    run(sh, "%config NeuronLab.display_as = 'widget'")
    try:
        yield run(sh, "%neuron dashboard")[0].result
    finally:
        run(sh, f"%config NeuronLab.display_as = {was!r}")


def _rows(panel) -> list[dict]:
    """The dashboard's rank rows, host by host (``live["ranks"]``)."""
    return [r for g in (panel.live.get("ranks") or {"hosts": []})["hosts"] for r in g["rows"]]


def _when(panel, ok: Callable[[list[dict]], bool], what: str) -> list[dict]:
    """The panel's rank rows once ``ok`` holds for them; fails after :data:`WAIT_S` saying ``what`` it waited for."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        rows = _rows(panel)
        if ok(rows):
            return rows
        time.sleep(0.05)
    raise AssertionError(f"the dashboard never showed {what} within {WAIT_S:g} s; last rows: {rows}")


def test_the_dashboard_shows_each_ranks_host_memory_fallbacks_and_state_live(hosts: InteractiveShell,
                                                                            tmp_path: Path) -> None:
    sh = hosts
    seen, waited = tmp_path / "seen", tmp_path / "waited"
    pids = [e.pid for e in session_of(sh).ranks.engines]
    store = session_of(sh).ranks.store.tcp
    assert store.add(rank_pulse.ASKED, 0) == 0  # no dashboard yet: the ranks were asked nothing
    with _dashboard(sh) as panel:
        found: dict[str, list[dict]] = {}
        failed: list[BaseException] = []

        def watch() -> None:
            try:
                found["allocated"] = _when(panel, lambda rows: [
                    (r.get("allocated"), r["status"]) for r in rows] == [
                    (8192, "running"), (16384, "running")], "both ranks running with x and y allocated")
                seen.touch()
                found["waiting"] = _when(panel, lambda rows: [r["status"] for r in rows] == [
                    "waiting in all_reduce", "running"], "rank 0 waiting in all_reduce, rank 1 running")
            except BaseException as e:  # noqa: BLE001  (reported on the main thread)
                failed.append(e)
            finally:
                seen.touch()
                waited.touch()

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        res, _ = run(sh, CELL.format(seen=str(seen), waited=str(waited)))
        cell = res.execution_count
        watcher.join(WAIT_S)
        assert not failed, failed[0]
        # a row per rank, by host, each with the rank's own bytes: x and atan2's y, 4 KiB each on rank 0, 8 on 1
        assert [(r["rank"], r["host"], r["device"], r["allocated"], r["fallback_calls"], r["cell"])
                for r in found["allocated"]] == [(0, "host0", "neuron:0", 8192, 1, cell),
                                                 (1, "host1", "neuron:0", 16384, 1, cell)]
        assert [r["status_text"] for r in found["allocated"]] == [f"running In[{cell}]"] * 2
        assert [r["collective"] for r in found["waiting"]] == ["all_reduce", None]
        assert panel.live["ranks"]["head"] == "ranks: 2 ranks on 2 hosts"  # grouped by host: two hosts
        assert [g["head"] for g in panel.live["ranks"]["hosts"]] == ["host0: rank 0", "host1: rank 1"]
        # after the cell: each rank's answer to the cell end's question, idle, the cell's fallbacks and memory
        rows = _rows(panel)
        assert [(r["status"], r["allocated"], r["peak"], r["fallback_calls"]) for r in rows] == [
            ("idle", 8192, 8192, 1), ("idle", 16384, 16384, 1)]
        text = static.render_text(panel.data, panel.live, panel.views)
        assert "ranks: 2 ranks on 2 hosts" in text
        assert "  host0: rank 0" in text and "  host1: rank 1" in text
        assert [line.split()[:4] for line in text.splitlines() if line.startswith("    1 ")] == [
            ["1", "neuron:0", "16.00", "KiB"]]
        html = static.render_html(panel.data, panel.live, panel.views)
        assert "host1: rank 1" in html and "16.00 KiB" in html

        engine = psutil.Process(pids[1])
        engine.suspend()  # a wedged host: its engine is there but answers nothing
        try:
            run(sh, f"import time\ntime.sleep({rank_pulse.SILENT_S + 1.5})")  # the dashboard asks while it runs
            assert [r["status"] for r in _rows(panel)] == ["idle", "not answering"]
        finally:
            engine.resume()  # the host is back, for the next test


def test_ranks_on_two_emulated_hosts_name_their_host_and_each_owns_its_hosts_first_device(hosts_shell) -> None:
    sh, started = hosts_shell
    pids = [e.pid for e in session_of(sh).ranks.engines]
    assert f"neuron_lab: rank 0 ready: pid {pids[0]}, neuron:0 on host0" in started
    assert f"neuron_lab: rank 1 ready: pid {pids[1]}, neuron:0 on host1" in started
    status = str(run(sh, "%neuron ranks")[0].result).splitlines()
    assert [line.split()[:5] for line in status[1:]] == [["rank", "0", "host0", "pid", str(pids[0])],
                                                         ["rank", "1", "host1", "pid", str(pids[1])]]
    res, cap = run(sh, "%%neuron ranks --timeout 60\nimport os, torch, torch.distributed as dist\n"
                       "x = torch.ones(2, device='neuron')\ndist.all_reduce(x)\n"
                       "print(os.environ['GROUP_RANK'], os.environ['NEURON_RT_ROOT_COMM_ID'].split(':')[0])\n")
    for rank in (0, 1):
        assert f"[stdout:{rank}] {rank} 127.0.0.1\n" in cap.stdout
    rr = res.result
    assert [(r.rank, r.host, r.report.device) for r in rr.ranks] == [(0, "host0", "neuron:0"),
                                                                      (1, "host1", "neuron:0")]
    assert [line.split()[:3] for line in str(rr).splitlines()[1:4]] == [
        ["rank", "host", "device"], ["0", "host0", "neuron:0"], ["1", "host1", "neuron:0"]]
    res, cap = run(sh, DDP_AND_FSDP2)
    assert_ddp_and_fsdp2(res.result, ["host0", "host1"], cap.stdout)


def test_a_lost_host_is_said_by_the_next_cell_and_the_dashboard_and_stop_leaves_every_row_stopped(
        hosts: InteractiveShell) -> None:
    sh = hosts
    pids = [e.pid for e in session_of(sh).ranks.engines]
    cluster = _children() - _OTHERS  # the ranks' engines, their nannies, the controller
    with _dashboard(sh) as panel:
        engine = psutil.Process(pids[1])
        engine.kill()  # host1's only rank: the host is lost
        psutil.wait_procs([engine], timeout=30)
        assert ranks_error(sh, "%%neuron ranks\nprint('never')\n") == (
            f"%%neuron ranks: host host1 is lost, with its rank 1 (pid {pids[1]}): the others would wait for it at "
            "their first collective; `%neuron ranks start 2 --hosts 2 --restart` starts the group afresh")
        run(sh, "1")  # a cell's end refreshes the dashboard
        assert [r["status"] for r in _rows(panel)] == ["idle", "lost"]
        run(sh, "%neuron ranks stop")
        assert [(r["rank"], r["host"], r["status"]) for r in _rows(panel)] == [
            (0, "host0", "stopped"), (1, "host1", "stopped")]
    assert _gone(cluster)
