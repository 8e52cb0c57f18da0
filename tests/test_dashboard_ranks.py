"""The live dashboard across hosts: with ranks started on two emulated hosts, the dashboard's synced state (read here,
in the notebook's shell, while a ``%%neuron ranks`` cell runs) has a row per rank with its host and its own memory and
CPU fallback calls, asked of the rank itself; a rank blocked in a collective says so, a suspended one is not answering,
a killed one is lost, and after ``stop`` every row says stopped.

Real ipyparallel engines (started once, about 20 s on a loaded 2-core machine). Every wait is bounded: the cell waits
for the test's files at most 60 s, the test for each state at most 60 s, and the engines are killed by pid on the way
out.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
from shells import loaded_shell, run

from neuron_lab.extension import session_of
from neuron_lab.session import rank_pulse
from neuron_lab.widgets import static

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


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _kill(pids: set[int]) -> None:
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
            procs[-1].kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=30)


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


def test_the_dashboard_shows_each_ranks_host_memory_fallbacks_and_state_live(tmp_path: Path) -> None:
    before = _children()
    seen, waited = tmp_path / "seen", tmp_path / "waited"
    with loaded_shell(instance=True) as sh:
        try:
            run(sh, "%neuron ranks start 2 --hosts 2 --timeout 60")
            pids = [e.pid for e in session_of(sh).ranks.engines]
            run(sh, "%config NeuronLab.display_as = 'widget'")
            store = session_of(sh).ranks.store.tcp
            assert store.add(rank_pulse.ASKED, 0) == 0  # no dashboard yet: the ranks were asked nothing
            panel = run(sh, "%neuron dashboard")[0].result
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
            run(sh, f"import time\ntime.sleep({rank_pulse.SILENT_S + 1.5})")  # the dashboard asks while it runs
            assert [r["status"] for r in _rows(panel)] == ["idle", "not answering"]
            engine.kill()  # host1's only rank
            psutil.wait_procs([engine], timeout=30)
            run(sh, "1")  # a cell's end refreshes the dashboard
            assert [r["status"] for r in _rows(panel)] == ["idle", "lost"]
            run(sh, "%neuron ranks stop")
            assert [(r["rank"], r["host"], r["status"]) for r in _rows(panel)] == [
                (0, "host0", "stopped"), (1, "host1", "stopped")]
        finally:
            _kill(_children() - before)
