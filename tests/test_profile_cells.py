"""``%%neuron profile`` in a real IPython shell and ``neuron_lab.profile()`` in a script: the cell runs once under
torch.profiler, and its report lists each op with its device and host time, calls, first shapes, whether it ran
natively, and the line that issued it, then the time per line; ``--export`` writes a Chrome/Perfetto trace.

Device time needs the compiled core (torch.profiler's PrivateUse1 hooks are C++ only); lines, calls and kinds
are asserted on either core."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import core
from IPython.core.error import UsageError
from shells import run

import neuron_lab
from neuron_lab.extension import session_of
from neuron_lab.report.model import Report
from neuron_lab.units import format_seconds

compiled_only = pytest.mark.skipif(core() != "compiled", reason="device time comes from the compiled core's "
                                                                "profiler hooks (C++ only)")

SETUP = """\
import torch
torch.manual_seed(0)
net = torch.nn.Linear(8, 8).to("neuron")
x = torch.randn(4, 8, device="neuron")
torch.atan2(x, x)  # warm: the first call classifies the op
"""
CELL = """\
y = net(x).relu()
for _ in range(3):
    z = torch.atan2(y, y)
loss = z.sum()
"""


def profiled_cell(shell, options: str = "") -> tuple[Report, str, int]:
    """Run CELL under ``%%neuron profile OPTIONS``: (its report, what it printed, its number)."""
    run(shell, SETUP)
    res, cap = run(shell, f"%%neuron profile {options}\n{CELL}".replace("profile \n", "profile\n"))
    report = session_of(shell).history[res.execution_count]
    assert report.profiled is not None
    return report, cap.stdout, res.execution_count


def rows_by_op(report: Report) -> dict:
    return {r.op: r for r in report.profiled.rows}


def refused(shell, cell: str) -> str:
    res, _ = run(shell, cell, ok=False)
    assert isinstance(res.error_in_exec, UsageError), repr(res.error_in_exec)
    return str(res.error_in_exec)


def test_each_op_has_its_calls_kind_and_cell_line(shell) -> None:
    report, _, n = profiled_cell(shell)
    rows = rows_by_op(report)
    addmm, relu, atan2, total = rows["aten::addmm"], rows["aten::relu"], rows["aten::atan2"], rows["aten::sum"]
    assert (addmm.kind, addmm.calls, relu.kind, relu.calls) == ("native", 1, "native", 1)
    assert (atan2.kind, atan2.calls, atan2.device_ns, total.calls) == ("fallback", 3, 0, 1)
    assert addmm.shapes == ((8,), (4, 8), (8, 8)) and addmm.dtypes == ("float32",) * 3
    where = {op: [(s.site.label, s.site.source, s.calls) for s in rows[op].sites] for op in rows}
    assert where["aten::addmm"] == [(f"In[{n}] line 2", "y = net(x).relu()", 1)]
    assert where["aten::relu"] == [(f"In[{n}] line 2", "y = net(x).relu()", 1)]
    assert where["aten::atan2"] == [(f"In[{n}] line 4", "z = torch.atan2(y, y)", 3)]
    assert where["aten::sum"] == [(f"In[{n}] line 5", "loss = z.sum()", 1)]
    lines = {x.site.label: x.calls for x in report.profiled.lines}
    assert lines == {f"In[{n}] line 2": 2, f"In[{n}] line 4": 3, f"In[{n}] line 5": 1}


@compiled_only
def test_native_ops_have_device_time_on_the_device_lane_and_the_report_shows_both_tables(shell) -> None:
    report, out, n = profiled_cell(shell)
    p = report.profiled
    rows = rows_by_op(report)
    assert rows["aten::addmm"].device_ns > 0 and rows["aten::relu"].device_ns > 0
    assert rows["aten::atan2"].host_ns > 0
    assert set(p.lanes) == {"neuron:0"} and 0 < p.lanes["neuron:0"] <= p.device_ns
    assert p.device_ns == sum(r.device_ns for r in p.rows)
    lines = out.splitlines()
    assert lines[0].startswith("Out[") and "<neuron_lab profile: " in lines[0]  # the cell's value, one line
    # the emulator's device lanes are host time, and every device time says so (the backend's word for its clock)
    assert lines[1].endswith(f"profiled: device (host clock) {format_seconds(p.device_ns / 1e9)}, "
                             f"host {format_seconds(p.host_ns / 1e9)}"), lines[1]
    assert any(x.startswith("profile: ") and ", device (host clock) " in x for x in lines), lines
    at = lines.index("ops by device (host clock) + host time:")
    assert re.split(r"\s{2,}", lines[at + 1].strip()) == ["op", "ran", "calls", "device (host clock)", "host",
                                                          "first shapes", "issued at"]
    assert "  device lanes: the emulator's own, its kernels run and timed on the host CPU" in "\n".join(lines)
    atan2 = next(line for line in lines[at:] if line.startswith("  aten::atan2 "))
    assert "CPU fallback" in atan2 and atan2.endswith(f"In[{n}] line 4")
    assert " 3 " in atan2  # calls
    addmm = next(line for line in lines[at:] if line.startswith("  aten::addmm "))
    assert " native " in addmm and addmm.endswith(f"In[{n}] line 2")
    per_line = lines.index("time per line:")
    assert re.split(r"\s{2,}", lines[per_line + 1].strip()) == ["line", "calls", "device (host clock)", "host",
                                                                "source"]
    rows = {line.split("  ")[1]: line for line in lines[per_line + 2:per_line + 5]}  # "  In[2] line 4  3  …"
    assert sorted(rows) == [f"In[{n}] line 2", f"In[{n}] line 4", f"In[{n}] line 5"]
    assert rows[f"In[{n}] line 4"].split()[3] == "3" and rows[f"In[{n}] line 4"].endswith("z = torch.atan2(y, y)")


@compiled_only
def test_export_writes_a_trace_with_the_device_lane_and_the_report_says_where(shell, tmp_path: Path) -> None:
    path = tmp_path / "cell.json"
    report, out, _ = profiled_cell(shell, f"--export {path}")
    assert report.profiled.trace_path == str(path)
    assert f"trace: {path} (open it in https://ui.perfetto.dev)" in out.splitlines()
    events = json.loads(path.read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]
    assert names[0] == "neuron:0" and {e["pid"] for e in kernels} == {0}
    assert [e["name"] for e in kernels] == ["aten::addmm", "aten::relu", "aten::sum"]
    fallbacks = [e["name"] for e in events if e.get("cat") == "privateuse1_runtime"]
    assert fallbacks == ["CPU fallback: aten::atan2"] * 3
    assert any(e.get("cat") == "python_function" for e in events)  # exported: the Python frames above each op


def test_row_limit_folds_the_tables_and_full_shows_every_row(shell) -> None:
    report, out, _ = profiled_cell(shell, "--row-limit 1")
    assert report.profiled.row_limit == 1
    lines = out.splitlines()
    assert f"  … {len(report.profiled.rows) - 1} more ops (`%neuron report --full`)" in lines
    assert "  … 2 more lines (`%neuron report --full`)" in lines
    full = str(Report.from_dict({**report.as_dict(), "detail": "full"}))
    assert all(f"  {r.op} " in full for r in report.profiled.rows)


def test_the_profile_survives_a_json_round_trip_and_renders_as_html(shell) -> None:
    report, _, n = profiled_cell(shell)
    back = Report.from_dict(json.loads(json.dumps(report.as_dict())))
    assert back.profiled == report.profiled
    html = report._repr_html_()
    assert "<b>ops by device (host clock) + host time</b>" in html and "<b>time per line</b>" in html
    assert ">device (host clock)</th>" in html and ">device</th>" not in html, html
    assert f"<td style=\"padding:1px 8px;text-align:left;vertical-align:top\">In[{n}] line 4</td>" in html


def test_a_failing_cell_keeps_its_profile_and_raises(shell) -> None:
    run(shell, SETUP)
    res, _ = run(shell, "%%neuron profile\ny = net(x)\nraise ValueError('stop')", ok=False)
    assert isinstance(res.error_in_exec, ValueError)
    report = session_of(shell).history[res.execution_count]
    assert report.error == "ValueError: stop"
    assert [(r.op, r.calls) for r in report.profiled.rows] == [("aten::addmm", 1)]


def test_the_cell_value_is_the_profile_whose_trace_exports_afterwards(shell, tmp_path: Path) -> None:
    """A plain profile cell (no --export) leaves its profile in ``Out`` and ``neuron_lab.last_profile()``; its
    trace is written afterwards, without running the cell again, and the cell shows its report once."""
    report, out, n = profiled_cell(shell)
    kept = shell.user_ns["Out"][n]  # and `_`, but the cell binds `_` itself
    assert kept is neuron_lab.last_profile()
    assert kept.report is report and kept.profiled is report.profiled
    assert out.count("ops by device (host clock) + host time:") == 1  # the report; the value is one short line
    assert f"Out[{n}]: <neuron_lab profile: {len(report.profiled.rows)} ops, 6 calls; " in out
    path = tmp_path / "after.json"
    run(shell, f"Out[{n}].export_chrome_trace({str(path)!r})")
    events = json.loads(path.read_text())["traceEvents"]
    ops = [e["name"] for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    assert {"aten::addmm", "aten::relu", "aten::atan2", "aten::sum"} <= set(ops)
    if core() == "compiled":  # the device lane and the fallbacks' host work, as --export writes them
        kernels = [e["name"] for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]
        assert kernels == ["aten::addmm", "aten::relu", "aten::sum"]
        fallbacks = [e["name"] for e in events if e.get("cat") == "privateuse1_runtime"]
        assert fallbacks == ["CPU fallback: aten::atan2"] * 3
    assert report.profiled.trace_path == str(path)
    assert f"trace: {path} (open it in https://ui.perfetto.dev)" in str(report).splitlines()


def test_the_trace_exports_as_often_as_asked(shell, tmp_path: Path) -> None:
    """torch.profiler writes a window's trace once ("Trace is already saved" after): an ``--export`` cell's profile,
    and one exported afterwards, write it again, the same trace under each file's own name, gzipped for ``.gz``."""
    first = tmp_path / "cell.json"
    report, _, _ = profiled_cell(shell, f"--export {first}")
    kept = neuron_lab.last_profile()
    again, packed = tmp_path / "again.json", tmp_path / "again.json.gz"
    kept.export_chrome_trace(str(again))
    kept.export_chrome_trace(str(packed))
    traces = [json.loads(first.read_text()), json.loads(again.read_text()), json.loads(gzip.open(packed).read())]
    assert [t.pop("traceName") for t in traces] == [str(first), str(again), str(packed)]
    assert traces[1] == traces[0] and traces[2] == traces[0]
    assert report.profiled.trace_path == str(packed)


def test_a_written_trace_is_read_back_from_its_file_and_a_gone_one_is_named(shell, tmp_path: Path) -> None:
    """A kept profile holds no copy of its trace (tens of MB with stacks): a later export reads the file the profile
    last wrote, and one that is gone since is named, with what to do."""
    first = tmp_path / "cell.json"
    profiled_cell(shell, f"--export {first}")
    kept = neuron_lab.last_profile()
    kept.export_chrome_trace(str(tmp_path / "second.json"))  # now the source
    first.unlink()
    kept.export_chrome_trace(str(tmp_path / "third.json"))
    (tmp_path / "third.json").write_text("{}")
    with pytest.raises(RuntimeError, match=r"trace was written to .*third\.json, which has changed or is gone since"):
        kept.export_chrome_trace(str(tmp_path / "fourth.json"))
    assert not (tmp_path / "fourth.json").exists()


def test_the_profile_gives_its_tables_afterwards(shell) -> None:
    report, _, n = profiled_cell(shell, "--row-limit 1")
    kept = neuron_lab.last_profile()
    table = kept.table().splitlines()  # every row, whatever the cell showed
    assert table[0].startswith("profile: ") and "ops by device (host clock) + host time:" in table
    assert all(any(line.startswith(f"  {r.op} ") for line in table) for r in report.profiled.rows)
    folded = kept.table(row_limit=2).splitlines()
    assert f"  … {len(report.profiled.rows) - 2} more ops (`%neuron report --full`)" in folded
    with pytest.raises(ValueError, match="--row-limit must be 1 or more, not 0"):
        kept.table(row_limit=0)
    torch_table = kept.key_averages().table(sort_by="cpu_time_total")  # torch.profiler's own
    ops = {"aten::addmm", "aten::relu", "aten::atan2", "aten::sum"}
    assert ops <= {e.key for e in kept.key_averages()} and all(op in torch_table for op in ops)
    with pytest.raises(ValueError, match=r"^export_chrome_trace /no/such/dir/t\.json: no directory /no/such/dir$"):
        kept.export_chrome_trace("/no/such/dir/t.json")


def test_a_failing_cell_leaves_its_profile_too(shell, tmp_path: Path) -> None:
    run(shell, SETUP)
    res, _ = run(shell, "%%neuron profile\ny = net(x)\nraise ValueError('stop')", ok=False)
    kept = neuron_lab.last_profile()
    assert kept.report is session_of(shell).history[res.execution_count]
    kept.export_chrome_trace(str(tmp_path / "failed.json"))
    names = {e["name"] for e in json.loads((tmp_path / "failed.json").read_text())["traceEvents"]}
    assert "aten::addmm" in names


def test_bad_options_are_refused_before_the_cell_runs(shell, tmp_path: Path) -> None:
    missing = tmp_path / "no" / "t.json"
    msg = refused(shell, f"%%neuron profile --export {missing}\nran = 1")
    assert msg.splitlines()[0] == f"%%neuron profile: --export {missing}: no directory {missing.parent}"
    msg = refused(shell, f"%%neuron profile --export {tmp_path}\nran = 1")
    assert msg.splitlines()[0].startswith(f"%%neuron profile: --export {tmp_path}: is a directory; give a file name")
    msg = refused(shell, "%%neuron profile --row-limit 0\nran = 1")
    assert msg.splitlines()[:2] == ["%%neuron profile: --row-limit must be 1 or more, not 0",
                                    "usage: %%neuron profile [--export PATH] [--row-limit N]"]  # the form written
    msg = refused(shell, "%%neuron profile torchneuron-2.33\nran = 1")
    assert msg.splitlines()[0].startswith("%%neuron profile: the cell form takes only --export PATH and --row-limit N")
    assert msg.splitlines()[-1] == "usage: %%neuron profile [--export PATH] [--row-limit N]"
    msg = refused(shell, "%%neuron profile --bogus\nran = 1")
    assert msg.splitlines() == ["%%neuron profile: unrecognized arguments: --bogus",
                                "usage: %%neuron profile [--export PATH] [--row-limit N]"]
    msg = refused(shell, "%%neuron profile --export\nran = 1")  # argparse's own errors name the form written too
    assert msg.splitlines() == ["%%neuron profile: argument --export: expected one argument",
                                "usage: %%neuron profile [--export PATH] [--row-limit N]"]
    with torch.profiler.profile():
        msg = refused(shell, "%%neuron profile\nran = 1")
    assert msg.splitlines()[0] == ("%%neuron profile: torch.profiler is already running: profiles do not nest; stop "
                                   "the other one first")
    assert "ran" not in shell.user_ns
    msg = refused(shell, f"%neuron profile --export {tmp_path / 't.json'}")
    assert msg.splitlines()[0].startswith("%neuron profile: --export and --row-limit go with the cell form")
    assert msg.splitlines()[1].startswith("usage: %neuron profile")


def test_a_profiler_started_inside_a_profiled_cell_takes_it_over_and_the_report_says_so(shell) -> None:
    """Profiles do not nest: a raw torch.profiler the cell starts takes torch.profiler's session over and ends it.
    The cell's profile then holds nothing and says why, where it said "no device activity" over 0 ops; the inner
    profiler keeps the ops, and the cell's record cannot be exported or tabulated."""
    from neuron_lab.report.profiled_rows import TAKEN_OVER

    run(shell, "import torch\nx = torch.randn(8, 8, device='neuron')")
    res, cap = run(shell, "%%neuron profile\nwith torch.profiler.profile() as inner:\n    y = x + 1\nz = x * 2")
    report = session_of(shell).history[res.execution_count]
    assert report.profiled.taken_over and TAKEN_OVER in str(report).splitlines()
    assert "profiled: none (taken over)" in str(report).splitlines()[0]
    assert "aten::add" in {e.key for e in shell.user_ns["inner"].key_averages()}
    with pytest.raises(RuntimeError, match="took torch.profiler over"):
        res.result.key_averages()


def test_profile_in_a_script_reports_file_and_line(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    trace = tmp_path / "script.json"
    script.write_text(textwrap.dedent(f"""\
        import json, torch, neuron_lab
        net = torch.nn.Linear(8, 8).to("neuron")
        x = torch.randn(4, 8, device="neuron")
        torch.atan2(x, x)
        with neuron_lab.profile(export={str(trace)!r}) as report:
            y = net(x).relu()
            z = torch.atan2(y, y)
        print(report)
        print(json.dumps({{r.op: [r.kind, r.calls, r.device_ns > 0, [s.site.label for s in r.sites]]
                          for r in report.profiled.rows}}))
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180,
                          env={**os.environ})
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = proc.stdout.splitlines()
    rows = json.loads(out[-1])
    device = core() == "compiled"
    assert rows == {"aten::addmm": ["native", 1, device, [f"{script}:6"]],
                    "aten::relu": ["native", 1, device, [f"{script}:6"]],
                    "aten::atan2": ["fallback", 1, False, [f"{script}:7"]]}
    assert out[0].startswith("neuron_lab profile · neuron:0 · default · ")
    assert f"trace: {trace} (open it in https://ui.perfetto.dev)" in out
    assert json.loads(trace.read_text())["traceEvents"]
    assert "USDT" not in proc.stderr  # Kineto's session lines, which a notebook would show under the cell


def test_last_profile_before_any_says_so_then_is_the_blocks(tmp_path: Path) -> None:
    script = tmp_path / "late.py"
    trace = tmp_path / "late.json"
    script.write_text(textwrap.dedent(f"""\
        import json, torch, neuron_lab
        try:
            neuron_lab.last_profile()
        except RuntimeError as e:
            print(e)
        x = torch.randn(4, 8, device="neuron")
        with neuron_lab.profile() as report:
            y = torch.atan2(x, x)
        kept = neuron_lab.last_profile()
        kept.export_chrome_trace({str(trace)!r})
        print(kept.report is report, kept.profiled is report.profiled)
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.splitlines() == [
        "no profile yet: run a `%%neuron profile` cell or a `with neuron_lab.profile():` block first", "True True"]
    names = [e["name"] for e in json.loads(trace.read_text())["traceEvents"]]
    assert "aten::atan2" in names


def test_profile_refuses_a_bad_export_path_before_running(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^--export .*: no directory "):
        with neuron_lab.profile(export=str(tmp_path / "no" / "t.json")):
            raise AssertionError("the block must not run")
    (tmp_path / "f").write_text("")
    with pytest.raises(ValueError, match=rf"^--export .*: {tmp_path / 'f'} is a file, not a directory$"):
        with neuron_lab.profile(export=str(tmp_path / "f" / "t.json")):
            raise AssertionError("the block must not run")
    # a folder that takes no new files (even for root, whom os.access lets write anywhere): torch would only log it
    with pytest.raises(ValueError, match=r"^--export /proc/t\.json: cannot write into /proc: "):
        with neuron_lab.profile(export="/proc/t.json"):
            raise AssertionError("the block must not run")
    assert list(tmp_path.iterdir()) == [tmp_path / "f"]  # the probe leaves nothing behind
    assert torch.neuron.is_available()


def test_backward_and_optimizer_ops_are_the_lines_that_ran_them(shell) -> None:
    run(shell, SETUP + "opt = torch.optim.SGD(net.parameters(), lr=0.1)\n")
    res, _ = run(shell, "%%neuron profile\nopt.zero_grad()\nloss = net(x).sum()\nloss.backward()\nopt.step()")
    n = res.execution_count
    report = session_of(shell).history[n]
    rows = rows_by_op(report)
    assert [(s.site.label, s.calls) for s in rows["aten::mm"].sites] == [(f"In[{n}] line 4", 1)]  # autograd's thread
    assert [(s.site.label, s.calls) for s in rows["aten::addmm"].sites] == [(f"In[{n}] line 3", 1)]
    assert {x.site.label for x in report.profiled.lines} == {f"In[{n}] line 3", f"In[{n}] line 4", f"In[{n}] line 5"}
