"""`%neuron ranks` in a real IPython shell: two ipyparallel engines as ranks 0 and 1 of one `neuron` process group,
`%%neuron ranks` cells that all_reduce and take a DDP step, a profiled cell (one timeline with each rank's lanes, one
merged trace), a rank that raises, a rank that is killed, restart and stop; and every refusal of the grammar.

The two engines start once per module (15-20 s on a loaded 2-core machine) and serve every test that needs two ranks
of one group; the tests that break it (a killed rank, an interrupted collective, a collective past the group's
timeout) run last, each restarting it as its own assertions need or getting it restarted by :func:`ranks` (4 starts in
all, where a group per test took 6). Every wait is bounded: the ranks start with ``--timeout 60`` (engines and
collectives), the cells that could wait run with ``--timeout 60``, and whatever a test started is killed by pid on its
way out.
"""

from __future__ import annotations

import _thread
import contextlib
import importlib.util
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import procs
import psutil
import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from rank_steps import DDP_AND_FSDP2, assert_ddp_and_fsdp2
from shells import loaded_shell, run

from neuron_lab.extension import session_of
from neuron_lab.report.ranks import RanksReport
from neuron_lab.session.ranks import LEFT_WAITING, RanksFailed

START = "%neuron ranks start {n} --timeout 60"

ALL_REDUCE_AND_DDP = """%%neuron ranks --timeout 60
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
rank = dist.get_rank()
x = torch.full((256,), rank + 1.0, device=device)
dist.all_reduce(x)
print(f"rank {rank}: sum {x[0].item():g}")
torch.manual_seed(0)
model = DDP(torch.nn.Linear(8, 4).to(device))
model(torch.ones(2, 8, device=device) * (rank + 1)).sum().backward()
"""


USAGE = ("usage: %neuron ranks [--timeout S] [--restart]\n"
         "                     [--engines {local,mpi,slurm,ssh}] [--hosts M]\n"
         "                     [--instance NAME[,NAME...]] [--partition NAME]\n"
         "                     [--nodes M] [--ntasks-per-node K] [--account NAME]\n"
         "                     [--time LIMIT] [--ssh-hosts HOST[,HOST...]]\n"
         "                     [--profile [NAME]] [--cluster-file PATH]\n"
         "                     [--sshserver HOST] [--export PATH] [--row-limit N]\n"
         "                     [{start,attach,interrupt,stop}] [N]")
CELL_USAGE = USAGE.replace("%neuron", "%%neuron").replace("\n ", "\n  ")  # a cell's error shows the cell form

PROFILED = """%%neuron ranks --profile --export {path} --timeout 60
import torch, torch.distributed as dist
a = torch.ones(64, 64, device=device) * (dist.get_rank() + 1)
b = a @ a
dist.all_reduce(b)
c = torch.atan2(b, a)
"""


def _pids(sh: InteractiveShell) -> list[int]:
    return [e.pid for e in session_of(sh).ranks.engines]


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


_OTHERS: set[int] = set()  # this test process's children that are not the module's ranks (earlier tests' kernels)


def _ranks_tree() -> set[int]:
    """The processes of the module's ranks: engines, their nannies, the controller and its schedulers."""
    return _children() - _OTHERS


def _gone(pids: set[int] | list[int]) -> bool:
    """No such process, or only its zombie entry (a child that has exited, not yet reaped)."""
    def gone(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    return all(gone(pid) for pid in pids)


def _kill(pids: set[int]) -> None:
    """The test's own engines and controller, by pid, whatever happened."""
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
            procs[-1].kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=30)


@pytest.fixture(scope="module")
def ranks_shell() -> Iterator[tuple[InteractiveShell, str]]:
    """A shell with ranks 0 and 1 started; the start's output."""
    before = _children()
    _OTHERS.update(before)
    with loaded_shell(instance=True) as sh:
        try:
            _, cap = run(sh, START.format(n=2))
            yield sh, cap.stdout
        finally:
            _kill(_children() - before)


@pytest.fixture
def ranks(ranks_shell) -> InteractiveShell:
    """The module's shell with its 2 ranks up, free and in one unbroken group of ``START``'s timeout: the group the
    module started, or, where an earlier test broke it, a restart."""
    sh, _ = ranks_shell
    r = session_of(sh).ranks
    if not (r is not None and r.broken is None and r.timeout_s == 60 and len(r.engines) == 2
            and all(e.alive() and e.free() for e in r.engines)):
        run(sh, START.format(n=2) + " --restart")
    return sh


@pytest.fixture(scope="module")
def plain_shell() -> Iterator[InteractiveShell]:
    """A shell with no ranks started."""
    with loaded_shell() as sh:
        yield sh


def ranks_error(sh: InteractiveShell, cell: str) -> str:
    res, _cap = run(sh, cell, ok=False)
    assert isinstance(res.error_in_exec, UsageError), repr(res.error_in_exec)
    return str(res.error_in_exec)


# -- two ranks --------------------------------------------------------------------------------------------------------
def test_start_shows_progress_and_status_names_each_rank(ranks_shell) -> None:
    sh, out = ranks_shell
    pids = _pids(sh)
    assert out.splitlines()[0] == "neuron_lab: starting 2 ipyparallel engines (ranks 0..1)…"
    assert f"neuron_lab: rank 0 ready: pid {pids[0]}, neuron:0" in out
    assert f"neuron_lab: rank 1 ready: pid {pids[1]}, neuron:1" in out
    res, _ = run(sh, "%neuron ranks")
    lines = str(res.result).splitlines()
    assert lines[0].startswith("neuron_lab ranks: 2 of 2 ranks up on ipyparallel, process group `neuron`")
    assert lines[1].split() == ["rank", "0", "pid", str(pids[0]), "neuron:0", "up"]
    assert lines[2].split() == ["rank", "1", "pid", str(pids[1]), "neuron:1", "up"]
    msg = ranks_error(sh, "%neuron ranks start 2")
    assert msg.startswith(f"%neuron ranks: 2 ranks already running (pids {pids[0]}, {pids[1]}); `%neuron ranks stop` "
                          "first, or add --restart")


def test_a_cell_on_all_ranks_reports_each_rank_and_all_together(ranks_shell) -> None:
    sh, _ = ranks_shell
    res, cap = run(sh, ALL_REDUCE_AND_DDP)
    rr = res.result
    assert isinstance(rr, RanksReport) and rr.title == f"In[{res.execution_count}]"
    for rank in (0, 1):  # a line naming its rank is that rank's, prefixed as %%px prefixes it; 1 + 2 on both ranks
        assert f"[stdout:{rank}] rank {rank}: sum 3\n" in cap.stdout
    assert [r.rank for r in rr.ranks] == [0, 1] and not rr.failed
    assert [r.report.device for r in rr.ranks] == ["neuron:0", "neuron:1"]
    for r in rr.ranks:
        rows = {row.op: row for row in r.report.ops_not_native if row.kind == "collective"}
        ar = rows["c10d::all_reduce.sum"]
        # 1 call of ours (256 float32) and DDP's gradient bucket (8*4 + 4 float32) in its backward
        assert (ar.count, ar.ranks, ar.nbytes) == (2, 2, 256 * 4 + 36 * 4), rows
        # DDP's construction: its parameters' shapes checked (1 all_gather), its state broadcast from rank 0 (2)
        assert {op: (row.count, row.nbytes) for op, row in rows.items()} == {
            "c10d::all_reduce.sum": (2, 1168), "c10d::broadcast": (2, 192), "c10d::all_gather": (1, 8)}
        assert r.collectives()[:2] == (5, 1368)
        ours = [sc for sc in ar.sites if sc.site.source == "dist.all_reduce(x)"]
        assert [(sc.site.cell, sc.site.line, sc.count) for sc in ours] == [(res.execution_count, 6, 1)]
        assert r.report.memory.after > 0 and r.report.memory.peak >= r.report.memory.after
        assert r.report.cell == res.execution_count
    assert rr.slowest is not None and rr.skew_s >= 0
    text = str(rr)
    assert text.startswith(f"neuron_lab In[{res.execution_count}] · 2 ranks · slowest rank {rr.slowest.rank} (")
    assert [line.split()[:2] for line in text.splitlines()[2:4]] == [["0", "neuron:0"], ["1", "neuron:1"]]
    assert f"        at In[{res.execution_count}] line 6: dist.all_reduce(x)  (2×)" in text.splitlines()  # both ranks
    status = str(sh.run_line_magic("neuron", "ranks")).splitlines()  # after a cell: both still up, not busy
    assert [line.split()[-1] for line in status[1:]] == ["up", "up"]


def test_a_torchrun_scripts_init_and_destroy_are_skipped_in_one_line_and_the_group_stays(ranks_shell) -> None:
    sh, _ = ranks_shell
    res, cap = run(sh, "%%neuron ranks --timeout 60\nimport torch, torch.distributed as dist\n"
                       "dist.init_process_group(backend='neuron')\nx = torch.ones(4, device=device)\n"
                       "dist.all_reduce(x)\ndist.destroy_process_group()\n")
    assert cap.stderr.splitlines() == [  # once for the cell, not once per rank; no traceback
        "[ranks 0-1] neuron_lab: the process group already exists (started by %neuron ranks): this call was skipped",
        "[ranks 0-1] neuron_lab: the process group stays (started by %neuron ranks; `%neuron ranks stop` ends it): "
        "destroy_process_group() was skipped"]
    assert [r.collectives()[0] for r in res.result.ranks] == [1, 1]
    res, cap = run(sh, "%%neuron ranks --timeout 60\ndist.all_reduce(x)\nprint(x[0].item())\n")  # still the group
    assert "[ranks 0-1] 4.0\n" in cap.stdout  # 2 + 2: both still in it


def test_a_second_default_group_fails_the_cell_in_one_line_for_all_ranks(ranks_shell) -> None:
    sh, _ = ranks_shell
    res, cap = run(sh, "%%neuron ranks\nimport torch.distributed as dist\ndist.init_process_group(backend='gloo')\n",
                   ok=False)
    said = ("ProcessGroupExists: the process group already exists (started by %neuron ranks: backend neuron, world "
            "size 2), not backend 'gloo'; dist.new_group() makes another group on these ranks")
    assert cap.stderr.splitlines() == ["[ranks 0-1:execute]", said]
    assert res.error_in_exec._render_traceback_() == [f"RanksFailed: 2 ranks of 2 failed in In[{res.execution_count}]",
                                                      f"  ranks 0-1: {said}"]


def test_stderr_alike_on_all_ranks_is_shown_once_and_a_ranks_own_with_its_rank(ranks_shell) -> None:
    sh, _ = ranks_shell
    _, cap = run(sh, "%%neuron ranks\nimport sys, warnings, torch.distributed as dist\n"
                     "warnings.warn('loss is nan')\nprint('only rank', dist.get_rank(), file=sys.stderr)\n")
    lines = cap.stderr.splitlines()
    [warning] = [line for line in lines if "UserWarning" in line]  # each rank's cell file is its own: still alike
    assert re.fullmatch(r"\[ranks 0-1\] /.*ipykernel_\d+/\d+\.py:\d+: UserWarning: loss is nan", warning), lines
    assert "[stderr:0] only rank 0" in lines and "[stderr:1] only rank 1" in lines
    assert "[ranks 0-1]   warnings.warn('loss is nan')" in lines


DDP_STEPS = """%%neuron ranks --timeout 120
import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
torch.manual_seed(0)
model = DDP(torch.nn.Linear(16, 1).to(device), device_ids=[device.index])
for step in range(5):  # DDP logs its runtime stats (and c10d's warning about them) from a later step
    x = torch.rand(64, 16).to(device)
    F.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
"""


def test_c10ds_warning_each_rank_tags_with_its_rank_is_shown_once(ranks: InteractiveShell, monkeypatch) -> None:
    """DDP's logger.cpp warning, logged by each rank as ``[rankN]:[W... logger.cpp:329] ...`` with its own
    timestamp, is one line for both ranks. Fresh ranks (c10d says it once a process), whose engines forward what C++
    writes to their stderr as a kernel does outside pytest (ipykernel does not under PYTEST_CURRENT_TEST)."""
    sh = ranks
    monkeypatch.delenv("PYTEST_CURRENT_TEST")
    run(sh, START.format(n=2) + " --restart")
    _, cap = run(sh, DDP_STEPS)
    said = [line for line in cap.stderr.splitlines() if "logger.cpp" in line]
    # one line: both ranks' as one, or (a rank whose line had not reached the notebook by the cell's end, once in CI)
    # one rank's; never a line per rank
    who = r"(\[ranks 0-1\] |\[stderr:\d\] \[rank\d\]:)"
    warning = r"\[W\d{4} [\d:.]+ logger\.cpp:\d+\] Warning: Time stats are currently only collected for CPU and CUDA"
    assert len(said) == 1 and re.fullmatch(who + warning + r" devices\..*", said[0]), said


STREAMED = """%%neuron ranks --timeout 60
import os, time, torch.distributed as dist
rank = dist.get_rank()
def wait_for(path):
    deadline = time.monotonic() + 30
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"the notebook never showed what {{path}} waits for while the cell ran"
        time.sleep(0.05)
dist.barrier()
print("epoch 1 loss", 0.5 + rank / 4)
print("waiting for", {seen!r})
wait_for({seen!r})
if rank == 1:
    wait_for({late!r})
print("checkpoint saved")
"""


class _Watch(io.StringIO):
    """stdout that touches a file once a line shows: what the ranks of a running cell wait for."""

    def __init__(self, touch: dict[str, Path]) -> None:
        super().__init__()
        self.touch = touch

    def write(self, text: str) -> int:
        n = super().write(text)
        for line, path in self.touch.items():
            if line in self.getvalue():
                path.touch()
        return n


def test_stdout_streams_collapsed_while_the_cell_runs_each_ranks_own_and_late_lines_with_its_rank(
        ranks_shell, tmp_path: Path) -> None:
    sh, _ = ranks_shell
    seen, late = tmp_path / "seen", tmp_path / "late"
    out = _Watch({f"[ranks 0-1] waiting for {seen}\n": seen, "[stdout:0] checkpoint saved\n": late})
    sh.run_line_magic("config", "NeuronLab.ranks_output_window_s = 3")  # the ranks print alike lines well within it
    try:
        with contextlib.redirect_stdout(out):  # the ranks go on once their line showed: it streamed while they ran
            res = sh.run_cell(STREAMED.format(seen=str(seen), late=str(late)), store_history=True)
    finally:
        sh.run_line_magic("config", "NeuronLab.ranks_output_window_s = 0.5")
    assert res.success, f"{res.error_in_exec}\n{out.getvalue()}"
    assert [line for line in out.getvalue().splitlines() if line.startswith("[")] == [
        "[ranks 0-1] epoch 1 loss {0: 0.5, 1: 0.75}", f"[ranks 0-1] waiting for {seen}",
        "[stdout:0] checkpoint saved",  # rank 1 printed it only after this showed: late, on its own line
        "[stdout:1] checkpoint saved"]


def test_a_helper_from_an_earlier_cell_is_one_row_for_all_ranks_at_the_notebooks_line(ranks_shell) -> None:
    sh, _ = ranks_shell
    first, _ = run(sh, "%%neuron ranks\nimport torch\ndef slow(x):\n    return torch.atan2(x, x)\n")
    res, _ = run(sh, "%%neuron ranks\nx = torch.ones(4, device=device)\ny = slow(x)\n")
    sites = [line.strip() for line in str(res.result).splitlines() if line.strip().startswith("at ")]
    assert sites == [f"at In[{first.execution_count}] line 4: return torch.atan2(x, x)  (2×)"]


def test_a_profiled_cell_shows_one_timeline_with_the_lanes_of_each_rank_and_exports_one_trace(
        ranks_shell, tmp_path: Path) -> None:
    sh, _ = ranks_shell
    path = tmp_path / "ranks.json"
    res, _ = run(sh, PROFILED.format(path=path))
    rr, n = res.result, res.execution_count
    assert not rr.failed and rr.trace_path == str(path)
    lanes = {x.name: x.spans for x in rr.timeline.lanes}
    assert list(lanes) == ["rank 0 neuron:0", "rank 0 host", "rank 1 neuron:1", "rank 1 host"]
    assert [m.device for m in rr.timeline.memory] == ["rank 0 neuron:0", "rank 1 neuron:1"]
    for r in rr.ranks:  # each rank's own profile, at the notebook cell's lines
        p = r.report.profiled
        rows = {(row.op, row.kind): [(lt.site.cell, lt.site.line) for lt in row.sites] for row in p.rows}
        assert rows[("aten::mm", "native")] == [(n, 4)] and rows[("aten::atan2", "fallback")] == [(n, 6)]
        assert p.trace_path is None
        assert [s.name for s in lanes[f"rank {r.rank} neuron:{r.rank}"] if s.name == "aten::mm"] == ["aten::mm"]
        assert [(s.name, s.kind) for s in lanes[f"rank {r.rank} host"]][-1] == ("aten::atan2", "fallback")

    def first(lane: str, op: str) -> int:
        return next(s.start_ns for s in lanes[lane] if s.name == op)

    # one clock: a rank's atan2 follows the all_reduce, which waited for the other rank, whose matmul came before
    assert first("rank 1 host", "aten::atan2") > first("rank 0 neuron:0", "aten::mm")
    assert first("rank 0 host", "aten::atan2") > first("rank 1 neuron:1", "aten::mm")

    text = str(rr).splitlines()
    head = text.index("profiled on 2 ranks: op table and time per line of rank 0, the timeline of all ranks on one "
                      "clock")
    assert text[head + 1].startswith("  rank 0: profile: ") and text[head + 1].endswith(")")
    assert "(neuron:0 busy " in text[head + 1] and "(neuron:1 busy " in text[head + 2]
    assert f"trace: {path} (open it in https://ui.perfetto.dev)" in text
    html = rr._repr_html_()
    for lane in [*lanes, "rank 0 neuron:0 memory", "rank 1 neuron:1 memory"]:
        assert f"data-lane='{lane}'" in html
    assert html.count("class='nlt-svg'") == 1  # one timeline for both ranks

    trace = json.loads(path.read_text())
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
    pid = {name: p for p, name in names.items()}
    assert {"rank 0", "rank 0 neuron:0", "rank 1", "rank 1 neuron:1"} <= set(pid)
    spans = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") != "python_function"]
    for rank in (0, 1):
        assert "aten::mm" in {e["name"] for e in spans if e["pid"] == pid[f"rank {rank} neuron:{rank}"]}
    [(s0, e0)], [(s1, e1)] = ([(e["ts"], e["ts"] + e["dur"]) for e in spans
                               if e["pid"] == pid[f"rank {rank}"] and "all_reduce" in e["name"]] for rank in (0, 1))
    assert e0 >= s1 and e1 >= s0  # on one time axis: neither rank's all_reduce ends before the other's begins


def test_a_rank_that_raises_is_reported_with_its_rank(ranks_shell) -> None:
    sh, _ = ranks_shell
    res, cap = run(sh, "%%neuron ranks\nimport torch, torch.distributed as dist\ny = torch.ones(3, device=device)\n"
                       "if dist.get_rank() == 1:\n    raise ValueError('bad shard on rank 1')\nprint('fine')\n",
                   ok=False)
    err = res.error_in_exec
    assert isinstance(err, RanksFailed), repr(err)
    assert err._render_traceback_() == [f"RanksFailed: 1 rank of 2 failed in In[{res.execution_count}]",
                                        "  rank 1: ValueError: bad shard on rank 1"]
    rr = err.report
    assert [(r.rank, r.problem) for r in rr.ranks] == [(0, None), (1, "ValueError: bad shard on rank 1")]
    assert rr.ranks[1].report.memory.after > 0  # its report up to the error, as a failing notebook cell's
    assert "[stdout:0] fine\n" in cap.stdout and "[stdout:1]" not in cap.stdout
    shown = re.sub(r"\x1b\[[0-9;]*m", "", cap.stderr)  # rank 1's traceback, as %%px shows it: lines of the body
    assert "[1:execute]\n" in shown and f"In[{res.execution_count}], line 4" in shown
    assert shown.rstrip().endswith("ValueError: bad shard on rank 1")
    assert "1 rank failed (1)" in str(rr)


def test_an_all_reduce_of_different_shapes_fails_on_every_rank_with_both_shapes_and_the_group_stays(
        ranks_shell) -> None:
    sh, _ = ranks_shell
    pids = _pids(sh)
    res, _cap = run(sh, "%%neuron ranks --timeout 60\nimport torch, torch.distributed as dist\n"
                        "x = torch.ones(4 + dist.get_rank(), device=device)\ndist.all_reduce(x)\n", ok=False)
    err = res.error_in_exec
    assert isinstance(err, RanksFailed), repr(err)
    said = ("CollectiveMismatch: all_reduce: the ranks' tensors differ (rank 0: [4] float32; rank 1: [5] float32); "
            "every rank must pass the same shape and dtype")
    assert err._render_traceback_() == [f"RanksFailed: 2 ranks of 2 failed in In[{res.execution_count}]",
                                        f"  ranks 0-1: {said}"]
    assert _pids(sh) == pids and all(e.alive() for e in session_of(sh).ranks.engines)
    res, _ = run(sh, "%%neuron ranks --timeout 60\nx = torch.ones(2, device=device)\ndist.all_reduce(x)\n")
    assert not res.result.failed


def test_a_profiled_rank_that_raises_keeps_its_profile_and_its_lanes(ranks_shell) -> None:
    sh, _ = ranks_shell
    res, _cap = run(sh, "%%neuron ranks --profile --timeout 60\nimport torch, torch.distributed as dist\n"
                        "b = torch.ones(64, 64, device=device) @ torch.ones(64, 64, device=device)\n"
                        "if dist.get_rank() == 1:\n    raise ValueError('bad shard on rank 1')\n", ok=False)
    rr = res.error_in_exec.report
    assert [(r.rank, r.problem) for r in rr.ranks] == [(0, None), (1, "ValueError: bad shard on rank 1")]
    mm = [row for row in rr.ranks[1].report.profiled.rows if row.op == "aten::mm"]
    assert [(row.calls, [lt.site.line for lt in row.sites]) for row in mm] == [(1, [3])]
    assert [x.name for x in rr.timeline.lanes] == ["rank 0 neuron:0", "rank 1 neuron:1"]
    assert rr.trace_path is None


def test_ranks_past_the_cells_deadline_are_reported_interrupted_and_free_again(ranks_shell) -> None:
    sh, _ = ranks_shell
    res, cap = run(sh, "%%neuron ranks --timeout 3\nimport time\nwhile True:\n    time.sleep(0.05)\n", ok=False)
    n = res.execution_count
    assert [(r.rank, r.problem) for r in res.error_in_exec.report.ranks] == [
        (0, "no answer after 3 s; interrupted"), (1, "no answer after 3 s; interrupted")]
    assert f"neuron_lab: sending SIGINT to 2 ranks still running In[{n}] (0, 1)" in cap.stderr
    for e in session_of(sh).ranks.engines:  # the interrupt ends each rank's cell: its own result says when
        e.busy.wait(60)
        assert e.free()
    res, cap = run(sh, "%%neuron ranks\nprint('after the interrupt')\n")
    assert not res.result.failed and "[ranks 0-1] after the interrupt\n" in cap.stdout


HUNG = """%%neuron ranks --timeout 4
import time, torch, torch.distributed as dist
x = torch.ones(4, device=device)
if dist.get_rank() == 1:
    time.sleep(60)
else:
    dist.all_reduce(x)
"""


def test_a_stuck_cell_shows_each_ranks_collective_and_line_and_the_next_cell_runs(ranks_shell) -> None:
    """Rank 1 skips the all_reduce and sleeps: the view says rank 0 waits in it at its line, rank 1 never reached it,
    and where rank 1 is; the timeout interrupts rank 1 (rank 0 is left in its all_reduce), and the next cell runs (its
    all_reduce frees rank 0)."""
    sh, _ = ranks_shell
    res, cap = run(sh, HUNG, ok=False)
    n = res.execution_count
    rr = res.error_in_exec.report
    assert [(r.rank, r.problem) for r in rr.ranks] == [(0, f"no answer after 4 s; {LEFT_WAITING}"),
                                                       (1, "no answer after 4 s; interrupted")]
    assert rr.hang() == [f"rank 0 waiting in all_reduce (group 0 of 2 ranks, [4] float32) at In[{n}] line 7: "
                         "dist.all_reduce(x)",
                         f"rank 1 never reached all_reduce: at In[{n}] line 5: time.sleep(60)"]
    assert f"neuron_lab: sending SIGINT to 1 rank still running In[{n}] (1)" in cap.stderr
    shown = str(rr).splitlines()
    assert shown[shown.index("where the ranks were at the deadline:") + 1:][:2] == ["  " + line for line in rr.hang()]
    assert "where the ranks were at the deadline" in rr._repr_html_()
    assert "rank 0 waiting in all_reduce" in "\n".join(res.error_in_exec._render_traceback_())
    zero, one = session_of(sh).ranks.engines
    one.busy.wait(60)  # the interrupt ended rank 1's sleep; rank 0 still waits in its all_reduce, not interrupted
    assert one.free() and not zero.free()
    res, _ = run(sh, "%%neuron ranks\ndist.all_reduce(x)\n", ok=False)  # runs on rank 1; its all_reduce meets rank 0's
    assert [r.problem for r in res.error_in_exec.report.ranks] == [f"still running In[{n}]; not run here", None]
    zero.busy.wait(60)
    assert zero.free()
    res, cap = run(sh, "%%neuron ranks\nprint('after the hang')\n")
    assert not res.result.failed and "[ranks 0-1] after the hang\n" in cap.stdout


FAILS_BEFORE_ITS_ALL_REDUCE = """%%neuron ranks
import sys, torch, torch.distributed as dist
x = torch.ones(1, device=device)
print('rank', dist.get_rank(), 'waits', file=sys.stderr)
if dist.get_rank() == 1:
    raise ValueError('rank 1 fails before the all_reduce')
dist.all_reduce(x)
"""


def test_a_rank_waiting_for_a_failed_rank_is_stopped_said_apart_and_the_next_cell_is_refused(
        ranks: InteractiveShell) -> None:
    """Rank 1 raises before the all_reduce rank 0 waits in: after the grace rank 0 is interrupted and waited for (its
    output is this cell's), reported stopped, not failed; the group is out of step, so the next cell is refused with
    what to run, where its all_reduce used to sum rank 0's tensor of this cell."""
    sh = ranks
    res, cap = run(sh, FAILS_BEFORE_ITS_ALL_REDUCE, ok=False)
    n = res.execution_count
    rr = res.error_in_exec.report
    zero, one = rr.ranks  # reported after the grace, not after the group's 60 s timeout
    assert (one.problem, one.stopped) == ("ValueError: rank 1 fails before the all_reduce", False)
    assert zero.stopped and zero.problem == (
        f"stopped: interrupted 5 s after rank 1 failed, waiting in all_reduce (group 0 of 2 ranks, [1] float32) at "
        f"In[{n}] line 7: dist.all_reduce(x)")
    assert str(rr).splitlines()[0].endswith(" · 1 rank failed (1) · 1 rank stopped (0)")
    assert "[ranks 0-1] rank 0 waits" not in cap.stderr and "[stderr:0] rank 0 waits" in cap.stderr
    assert "KeyboardInterrupt" not in cap.stderr  # the notebook's own interrupt: the table says where it was
    broken = (f"the process group broke in In[{n}]: rank 0 interrupted inside all_reduce, which the other ranks' next "
              "collectives would meet out of step, so no collective can run again; `%neuron ranks start 2 "
              "--restart` starts the group afresh")
    assert res.error_in_exec._render_traceback_() == [
        f"RanksFailed: 1 rank of 2 failed in In[{n}], 1 stopped", f"  rank 0: {zero.problem}",
        f"  rank 1: {one.problem}", f"  {broken}"]
    assert all(e.free() for e in session_of(sh).ranks.engines)
    assert ranks_error(sh, "%%neuron ranks\ndist.all_reduce(x)\nprint('after', x.item())\n") == (
        f"%%neuron ranks: {broken}")


def test_a_killed_engine_is_reported_dead_and_restart_replaces_it(ranks: InteractiveShell) -> None:
    sh = ranks
    pids = _pids(sh)
    res, _cap = run(sh, "%%neuron ranks --profile --timeout 60\nimport os, signal, torch, torch.distributed as dist\n"
                        "x = torch.ones(8, device=device) * 2\n"
                        "if dist.get_rank() == 1:\n    os.kill(os.getpid(), signal.SIGKILL)\nprint('rank 0 lives')\n",
                    ok=False)
    rr = res.error_in_exec.report  # reported as dead, not as the cell's 60 s passing
    assert [(r.rank, r.problem) for r in rr.ranks] == [(0, None), (1, f"engine 1 died (pid {pids[1]})")]
    assert [x.name for x in rr.timeline.lanes] == ["rank 0 neuron:0"]  # a dead rank has no lanes, and is named
    assert f"  rank 1: no profile, no lanes (engine 1 died (pid {pids[1]}))" in str(rr).splitlines()
    # the next cell runs nowhere: rank 0's first collective would wait for the dead rank until the group's timeout
    assert ranks_error(sh, "%%neuron ranks\nprint('again')\n") == (
        f"%%neuron ranks: 1 rank of the group died (engine 1 (pid {pids[1]})): the others would wait for it at their "
        "first collective; `%neuron ranks start 2 --restart` starts the group afresh")
    status = str(sh.run_line_magic("neuron", "ranks")).splitlines()
    assert status[0].startswith("neuron_lab ranks: 1 of 2 ranks up")
    assert [line.split()[-1] for line in status[1:]] == ["up", "died"]

    old = _ranks_tree()
    run(sh, START.format(n=2) + " --restart")  # the group the interrupt tests below take
    assert _gone(old)
    new = _pids(sh)
    assert len(new) == 2 and not set(new) & set(pids)
    res, _ = run(sh, "%%neuron ranks\nimport torch.distributed as dist\nw = dist.get_world_size()\n")
    assert [r.report.device for r in res.result.ranks] == ["neuron:0", "neuron:1"]


# -- the grammar --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("cell", "message"), [
    ("%%neuron ranks\nx = 1\n", "%%neuron ranks: no ranks are running; start them first with `%neuron ranks start N` "
                                "on a line of its own (e.g. `%neuron ranks start 2`)"),
    ("%neuron ranks start", "%neuron ranks: start needs N, how many ranks: `%neuron ranks start 2`"),
    ("%neuron ranks start 0", "%neuron ranks: N must be from 1 to 64, not 0"),
    ("%neuron ranks start 65", "%neuron ranks: N must be from 1 to 64, not 65"),
    ("%neuron ranks start 2 --timeout 0", "%neuron ranks: --timeout must be a number of seconds > 0, not 0"),
    ("%neuron ranks stop 2", "%neuron ranks: N goes with start: `%neuron ranks start 2`"),
    ("%neuron ranks interrupt 2", "%neuron ranks: N goes with start: `%neuron ranks start 2`"),
    ("%neuron ranks --restart", "%neuron ranks: --timeout and --restart go with start"),
    ("%neuron ranks start 3 --hosts 2", "%neuron ranks: --hosts 2 must divide the 3 ranks evenly"),
    ("%neuron ranks --hosts 2", "%neuron ranks: --hosts, --instance and --engines go with start"),
    ("%neuron ranks start 2 --hosts 2 --instance trn2.48xlarge,trn1.32xlarge,trn1.2xlarge",
     "%neuron ranks: --instance: 3 instances for 2 hosts: give one for all, or one per host"),
    ("%neuron ranks start 2 --instance p5.48xlarge", "%neuron ranks: --instance: 'p5.48xlarge' is not an instance the "
                                                     "emulator knows"),
    ("%neuron ranks start 2 --hosts 2 --engines mpi", "%neuron ranks: --hosts emulates hosts with local engines; mpi "
                                                      "engines are where it puts them"),
    ("%neuron ranks start 2 --partition gpu", "%neuron ranks: --partition goes with --engines slurm"),
    ("%neuron ranks start 4 --hosts 2 --engines slurm --nodes 2",
     "%neuron ranks: --hosts emulates hosts on the Slurm job's one node; --nodes asks Slurm for real ones"),
    ("%neuron ranks --nodes 2", "%neuron ranks: --hosts, --instance and --engines go with start"),
    ("%neuron ranks start 2 --sshserver login1", "%neuron ranks: --sshserver goes with attach"),
    ("%neuron ranks start 2 --ssh-hosts a,b", "%neuron ranks: --ssh-hosts goes with --engines ssh"),
    ("%neuron ranks start 2 --engines ssh", "%neuron ranks: ssh engines need their hosts: `--engines ssh --ssh-hosts "
                                            "node1,node2`"),
    ("%neuron ranks start 3 --engines ssh --ssh-hosts a,b",
     "%neuron ranks: the 3 ranks do not divide evenly over the 2 ssh hosts"),
    ("%neuron ranks start 2 --engines ssh --ssh-hosts a,a", "%neuron ranks: --ssh-hosts: 'a,a' names a host twice"),
    ("%neuron ranks --ssh-hosts a", "%neuron ranks: --hosts, --instance and --engines go with start"),
    ("%neuron ranks attach --ssh-hosts a", "%neuron ranks: attach takes the cluster that runs"),
    ("%neuron ranks attach --profile a --cluster-file b", "%neuron ranks: attach: --profile NAME or --cluster-file "
                                                          "PATH, one of them"),
    ("%neuron ranks attach 2", "%neuron ranks: attach takes the cluster that runs"),
    ("%%neuron ranks start 2\nx = 1\n", "%%neuron ranks: the cell form runs the cell on the ranks and takes only "
                                         "--timeout S"),
    ("%neuron ranks begin", "%neuron ranks: argument action: invalid choice: 'begin'"),
    ("%neuron ranks start two", "%neuron ranks: argument N: invalid int value: 'two'"),
    ("%neuron ranks --profile", "%neuron ranks: --profile goes with the cell form: put `%%neuron ranks --profile` on "
                                "the first line of the cell to profile on every rank"),
    ("%%neuron ranks --export t.json\nx = 1\n", "%%neuron ranks: --export goes with --profile (`%%neuron ranks "
                                                 "--profile --export PATH`)"),
    ("%%neuron ranks --profile --export /no/such/dir/t.json\nx = 1\n",
     "%%neuron ranks: --export /no/such/dir/t.json: no directory /no/such/dir"),
    ("%%neuron ranks --profile --row-limit 0\nx = 1\n", "%%neuron ranks: --row-limit must be 1 or more, not 0"),
    ("%%neuron ranks --profile --row-limit\nx = 1\n", "%%neuron ranks: argument --row-limit: expected one argument"),
])
def test_ranks_refusals(plain_shell: InteractiveShell, cell: str, message: str) -> None:
    msg = ranks_error(plain_shell, cell)
    assert msg.startswith(message), msg
    if not cell.startswith("%%neuron ranks\n"):  # a grammar error: the usage follows
        assert msg.endswith(CELL_USAGE if cell.startswith("%%") else USAGE)
    assert session_of(plain_shell).ranks is None


def test_neuron_lab_runs_ssh_engines_and_hosts_are_the_starts_defaults(plain_shell, monkeypatch) -> None:
    """`neuron-lab run --engines ssh --ssh-hosts ...` sets them for the kernel: a notebook's plain `start N` takes
    them, and is refused as the line would be (checked before any engine starts)."""
    monkeypatch.setenv("NEURON_LAB_RANKS_ENGINES", "ssh")
    monkeypatch.setenv("NEURON_LAB_RANKS_SSH_HOSTS", "a,b")
    msg = ranks_error(plain_shell, "%neuron ranks start 3")
    assert msg.startswith("%neuron ranks start: the 3 ranks do not divide evenly over the 2 ssh hosts"), msg
    monkeypatch.delenv("NEURON_LAB_RANKS_SSH_HOSTS")
    msg = ranks_error(plain_shell, "%neuron ranks start 2")
    assert msg.startswith("%neuron ranks start: ssh engines need their hosts"), msg
    assert session_of(plain_shell).ranks is None


def test_status_and_stop_without_ranks_say_so(plain_shell: InteractiveShell) -> None:
    sh = plain_shell
    assert str(run(sh, "%neuron ranks")[0].result) == ("neuron_lab ranks: none running; start them with "
                                                       "`%neuron ranks start N`")
    assert str(run(sh, "%neuron ranks stop")[0].result) == "neuron_lab ranks: none running"
    assert str(run(sh, "%neuron ranks interrupt")[0].result) == "neuron_lab ranks: none running"


def test_a_start_that_fails_leaves_nothing_running(plain_shell: InteractiveShell) -> None:
    before = _children()
    try:
        msg = ranks_error(plain_shell, "%neuron ranks start 2 --timeout 0.01")  # no engine registers in 10 ms
        assert msg == ("%neuron ranks start: the engines did not start within 0.01 s (--timeout S waits longer); "
                       "nothing is left running")
        assert _gone(_children() - before) and session_of(plain_shell).ranks is None
    finally:
        _kill(_children() - before)


def test_a_planted_setting_mismatch_stops_the_start_with_the_preflight_table_and_nothing_running(
        plain_shell: InteractiveShell, monkeypatch: pytest.MonkeyPatch) -> None:
    from neuron_lab.session import launch

    def planted(*args: object, **kwargs: object) -> list[dict[str, str]]:  # rank 1's host set up another way
        envs = place_envs(*args, **kwargs)
        return [{**env, "FI_PROVIDER": "tcp" if r else "efa"} for r, env in enumerate(envs)]

    place_envs = launch.place_envs
    monkeypatch.setattr(launch, "place_envs", planted)
    before = _children()
    try:
        msg = ranks_error(plain_shell, START.format(n=2)).splitlines()
        assert msg[0] == ("%neuron ranks start: the ranks differ, so none joined the process group; nothing is left "
                          "running")
        assert msg[1] == "neuron_lab preflight: 2 ranks differ in FI_PROVIDER"
        assert [[line.split()[0], *line.split()[7:]] for line in msg[2:]] == [["rank", "FI_PROVIDER"], ["0", "efa"],
                                                                              ["1", "tcp"]]
        assert _gone(_children() - before) and session_of(plain_shell).ranks is None
    finally:
        _kill(_children() - before)


def test_ranks_interrupt_wakes_a_rank_in_its_collective_says_where_each_was_and_the_next_cell_says_what_to_run(
        ranks: InteractiveShell) -> None:
    """Rank 1 skips the all_reduce and sleeps; the deadline interrupts it and leaves rank 0 in its all_reduce, which
    `%neuron ranks interrupt` ends (the emulated collective waits in slices, so the KeyboardInterrupt lands); rank 0
    was woken inside its collective, so the next cell says in one line that the group broke and what to run."""
    sh = ranks
    res, _ = run(sh, HUNG, ok=False)
    n = res.execution_count
    zero, one = session_of(sh).ranks.engines
    one.busy.wait(60)
    assert one.free() and not zero.free()
    res, cap = run(sh, "%neuron ranks interrupt")
    assert str(res.result).splitlines() == [
        f"neuron_lab ranks: interrupted rank 0 running In[{n}]; where each was:",
        f"  rank 0 waiting in all_reduce (group 0 of 2 ranks, [4] float32) at In[{n}] line 7: dist.all_reduce(x)",
        f"  the process group broke in In[{n}]: rank 0 interrupted inside all_reduce, which the other ranks' next "
        "collectives would meet out of step, so no collective can run again; `%neuron ranks start 2 --restart` "
        "starts the group afresh"]
    assert f"neuron_lab: sending SIGINT to 1 rank still running In[{n}] (0)" in cap.stderr
    assert zero.free()  # the interrupt ended its all_reduce: its cell is over
    assert str(run(sh, "%neuron ranks interrupt")[0].result) == (
        "neuron_lab ranks: no rank is running a cell; nothing to interrupt")
    assert ranks_error(sh, "%%neuron ranks\nprint(dist.get_rank())\n") == (
        f"%%neuron ranks: the process group broke in In[{n}]: rank 0 interrupted inside all_reduce, which the "
        "other ranks' next collectives would meet out of step, so no collective can run again; "
        "`%neuron ranks start 2 --restart` starts the group afresh")
    run(sh, START.format(n=2) + " --restart")  # the group the next test takes
    _, cap = run(sh, "%%neuron ranks\nimport torch.distributed as dist\nprint('rank', dist.get_rank())\n")
    assert "rank 0" in cap.stdout and "rank 1" in cap.stdout


def test_the_kernels_interrupt_while_a_ranks_cell_waits_interrupts_every_rank_and_shows_where_each_was(
        ranks: InteractiveShell) -> None:
    """Jupyter's stop button (KeyboardInterrupt in the notebook) while rank 0 waits in an all_reduce that rank 1
    skipped: the hang view on stderr, SIGINT to both ranks, and the group broken by rank 0's woken collective."""
    sh = ranks
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job starts with SIGINT ignored

    def interrupt_once_rank_0_waits() -> None:
        deadline = time.monotonic() + 60
        ranks = session_of(sh).ranks
        while time.monotonic() < deadline:
            if (at := ranks._where_stuck([0]).get(0)) is not None and at.collective is not None:
                _thread.interrupt_main()
                return
            time.sleep(0.2)
        _thread.interrupt_main()  # the assertions below say rank 0 never got into its all_reduce

    try:
        thread = threading.Thread(target=interrupt_once_rank_0_waits, daemon=True)
        thread.start()
        res, cap = run(sh, HUNG.replace(" --timeout 4", ""), ok=False)
        thread.join(60)
        n = res.execution_count
        assert isinstance(res.error_in_exec, KeyboardInterrupt), repr(res.error_in_exec)
        assert (f"neuron_lab: sending SIGINT to 2 ranks still running In[{n}] (0, 1)\n"
                "neuron_lab: where they were:\n"
                f"  rank 0 waiting in all_reduce (group 0 of 2 ranks, [4] float32) at In[{n}] line 7: "
                "dist.all_reduce(x)\n"
                f"  rank 1 never reached all_reduce: at In[{n}] line 5: time.sleep(60)\n") in cap.stderr
        for e in session_of(sh).ranks.engines:  # each woken: rank 0 out of its collective, rank 1 out of its sleep
            e.busy.wait(60)
            assert e.free()
        assert ranks_error(sh, "%%neuron ranks\nprint(dist.get_rank())\n") == (
            f"%%neuron ranks: the process group broke in In[{n}]: rank 0 interrupted inside all_reduce, which the "
            "other ranks' next collectives would meet out of step, so no collective can run again; "
            "`%neuron ranks start 2 --restart` starts the group afresh")
    finally:
        signal.signal(signal.SIGINT, handler)


def _start_with_a_short_timeout(sh: InteractiveShell) -> int:
    """Restart the 2 ranks with a group timeout short enough to wait out, 15 s; where the machine is so loaded that the
    start itself (whose deadline is that timeout: engines up, process group joined) does not fit in it, with
    ``START``'s 60 s, which the module's other starts fit in. The timeout the group got."""
    for timeout in (15, 60):
        res, _ = run(sh, f"%neuron ranks start 2 --timeout {timeout} --restart", ok=False)
        if res.success:
            return timeout
        late = re.search(r"did not start within|did not join the process group in time|[Tt]imed? ?out",
                         str(res.error_in_exec))
        assert isinstance(res.error_in_exec, UsageError) and late, repr(res.error_in_exec)
    pytest.fail("2 ranks did not start within 60 s")


def test_after_a_collective_outlived_the_groups_timeout_the_next_cell_says_so_and_stop_leaves_no_process(
        ranks_shell) -> None:
    """gloo closes the group's connections once a collective times out; the next cells used to fail one by one. Last
    of the module's group: its stop leaves nothing running."""
    sh, _ = ranks_shell
    timeout = _start_with_a_short_timeout(sh)  # the group this test breaks
    res, _ = run(sh, f"%%neuron ranks --timeout {timeout + 60}\nimport torch, torch.distributed as dist\n"
                     "x = torch.ones(2, device=device)\nif dist.get_rank() == 0:\n    dist.all_reduce(x)\n",
                 ok=False)  # the cell's deadline well past the group's: the collective's timeout ends the cell
    assert isinstance(res.error_in_exec, RanksFailed), repr(res.error_in_exec)
    first = res.execution_count
    msg = ranks_error(sh, "%%neuron ranks --timeout 60\ndist.all_reduce(x)\n")
    assert re.fullmatch(rf"%%neuron ranks: the process group broke in In\[{first}\]: rank 0's collective outlived "
                        rf"the group's timeout \({timeout} s; gloo: Timed out waiting {timeout}000ms for \w+ operation "
                        r"to complete\), so no collective can run again; `%neuron ranks start 2 --restart` starts "
                        r"the group afresh", msg), msg

    pids, cluster = _pids(sh), _ranks_tree()
    res, _ = run(sh, "%neuron ranks stop")
    assert str(res.result) == f"neuron_lab ranks: stopped 2 ranks (pids {pids[0]}, {pids[1]})"
    assert _gone(cluster)
    assert session_of(sh).ranks is None
    assert "no ranks are running" in ranks_error(sh, "%%neuron ranks\nprint(1)\n")


@pytest.mark.skipif(shutil.which("mpiexec") is None or importlib.util.find_spec("mpi4py") is None,
                    reason="--engines mpi needs Open MPI's mpiexec and mpi4py (.ci/run installs both)")
def test_mpi_engines_are_the_ranks_mpiexec_numbered_and_stop_leaves_nothing(plain_shell: InteractiveShell,
                                                                           monkeypatch) -> None:
    if os.geteuid() == 0:  # CI's containers run as root, which mpiexec refuses unless told
        monkeypatch.setenv("OMPI_ALLOW_RUN_AS_ROOT", "1")
        monkeypatch.setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    sh, before = plain_shell, _children()
    try:
        _, cap = run(sh, START.format(n=2) + " --engines mpi")
        assert "neuron_lab: 2 ranks ready in" in cap.stdout
        res, cap = run(sh, "%%neuron ranks --timeout 60\nimport os, torch, torch.distributed as dist\n"
                           "x = torch.ones(2, device=device)\ndist.all_reduce(x)\n"
                           "print(os.environ['OMPI_COMM_WORLD_RANK'], dist.get_rank(), int(x[0]))\n")
        for rank in (0, 1):  # the group's rank is the one mpiexec gave the engine
            assert f"[stdout:{rank}] {rank} {rank} 2\n" in cap.stdout
        assert [(r.rank, r.report.device) for r in res.result.ranks] == [(0, "neuron:0"), (1, "neuron:1")]
        res, cap = run(sh, DDP_AND_FSDP2)  # mpiexec's ranks are on one host: it cannot emulate several
        assert_ddp_and_fsdp2(res.result, [socket.gethostname()] * 2, cap.stdout)
        run(sh, "%neuron ranks stop")
        assert _gone(_children() - before)
    finally:
        _kill(_children() - before)


def test_help_lists_ranks_with_its_forms(plain_shell: InteractiveShell) -> None:
    doc = plain_shell.find_line_magic("neuron").__doc__
    assert "\n  ranks      run cells on N ranks of one `neuron` process group, one ipyparallel engine each" in doc
    assert f"--- ranks ---\n{USAGE}\n\n" \
           "`start N`: ranks 0..N-1 on ipyparallel engines (local, mpi, slurm or ssh; torchrun's variables set, " \
           "neuron:RANK each)" in doc


NOTEBOOK = """
import json, os
from IPython.core.interactiveshell import InteractiveShell
sh = InteractiveShell.instance()
sh.run_line_magic("load_ext", "neuron_lab")
sh.run_line_magic("neuron", "ranks start 2 --timeout 60")
from neuron_lab.extension import session_of
r = session_of(sh).ranks
print(json.dumps([r.cluster.controller.pid, *(e.pid for e in r.engines)]), flush=True)
input()
"""


def test_ranks_whose_notebook_is_killed_end_with_it(tmp_path: Path) -> None:
    """A kernel killed without a stop (no atexit runs): its engines and their controller do not outlive it."""
    proc = subprocess.Popen([sys.executable, "-c", NOTEBOOK], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env={**os.environ, "IPYTHONDIR": str(tmp_path)})
    started: list[psutil.Process] = []
    try:
        out, line = procs.Lines(proc.stdout), ""
        while not line.startswith("["):  # after the start's progress lines
            line = out.next(120, "the notebook's ranks to start and print their pids")
            assert line, "the notebook ended before its ranks started"
        pids = json.loads(line)
        started = [psutil.Process(pid) for pid in pids]
        started += [c for p in started for c in p.children(recursive=True)]  # nannies, schedulers
        proc.kill()
        proc.wait(30)
        _, alive = psutil.wait_procs(started, timeout=15)
        assert not alive, f"still running 15 s after their notebook was killed: {[p.pid for p in alive]}"
    finally:
        proc.kill()
        _kill({p.pid for p in started})
