"""`neuron-lab run --trace DIR`: a Chrome/Perfetto trace per cell for CI artifacts, one lane per rank with --nproc.

The runs are the real command on tiny `# %%` scripts written here, each bounded in time (a run past its
bound is killed with its kernels); one run serves several assertions, as the CI machine is small. The traces
are what torch.profiler exports from the compiled core (device lanes per `neuron:i`, CPU fallbacks as host
work), so the events asserted are exact; the merge of the ranks' traces is also checked on its own, as JSON.
"""

from __future__ import annotations

import gc
import json
import os
import textwrap
import weakref
from pathlib import Path
from typing import Any

import pytest
from conftest import core, neuron_lab_run
from shells import run as run_cell

from neuron_lab.extension import session_of
from neuron_lab.runner import options, traces
from neuron_lab.runner.inputs import InputError
from neuron_lab.runner.kernel_trace import OWN_PROFILER, CellTracer
from neuron_lab.trace import merge

RUN_TIMEOUT = 240  # seconds for one whole `neuron-lab run`
compiled_only = pytest.mark.skipif(core() != "compiled", reason="device lanes come from the compiled core's "
                                                                "profiler hooks (C++ only)")


def run(tmp: Path, text: str, *args: str) -> tuple[int, str]:
    """``neuron-lab run t.py ARGS`` on ``text``."""
    (tmp / "t.py").write_text(textwrap.dedent(text).lstrip())
    return neuron_lab_run(tmp, "t.py", "--backend", "emulator", *args, timeout=RUN_TIMEOUT)


def events(path: Path) -> list[dict[str, Any]]:
    return json.loads(path.read_text())["traceEvents"]


def processes(evs: list[dict[str, Any]]) -> dict[Any, str]:
    """Each process's name; in one rank's own trace the host process (labelled CPU) is ``host``."""
    host = {e["pid"] for e in evs if e.get("ph") == "M" and e.get("name") == "process_labels"
            and e["args"]["labels"] == "CPU"}
    return {e["pid"]: "host" if e["pid"] in host else e["args"]["name"] for e in evs
            if e.get("ph") == "M" and e.get("name") == "process_name"}


def on(evs: list[dict[str, Any]], process: str, cat: str | None = None) -> list[str]:
    """The names of the complete events on the process named ``process`` (of category ``cat``)."""
    pid = {name: pid for pid, name in processes(evs).items()}[process]
    return [e["name"] for e in evs if e.get("ph") == "X" and e["pid"] == pid and cat in (None, e.get("cat"))]


THREE_CELLS = """
    import torch
    a = torch.ones(16, 16).to("neuron")
    c = a @ a
    # %%
    d = torch.atan2(a, a)
    # %%
    e = a @ a
    raise ValueError("stop here")
"""


@compiled_only
def test_each_cell_writes_its_trace_even_the_one_that_raised(tmp_path):
    code, text = run(tmp_path, THREE_CELLS, "--trace", "traces/ci", "--json", "run.json")
    assert code == options.EXIT_CELL_ERROR, text
    folder = tmp_path / "traces" / "ci"  # created, with its parent
    assert sorted(p.name for p in folder.iterdir()) == ["cell-001.json", "cell-002.json", "cell-003.json"]
    assert f"\ntraces: 3 Chrome traces in {folder}{os.sep} (cell-001.json … cell-003.json); open one in " \
           "https://ui.perfetto.dev\n" in text
    one, two, three = (events(folder / f"cell-00{k}.json") for k in (1, 2, 3))
    # cell 1: the matmul is a kernel on the device lane, and there is no atan2 in it
    assert on(one, "neuron:0", "kernel") == ["aten::mm"]
    assert not [e for e in one if "atan2" in e.get("name", "")]
    # cell 2: atan2 fell back, as host work on the CPU process; no matmul ran
    assert on(two, "host", "privateuse1_runtime") == ["CPU fallback: aten::atan2"]
    assert "neuron:0" not in processes(two) or on(two, "neuron:0", "kernel") == []
    # cell 3 raised after its matmul: its trace was still written
    assert on(three, "neuron:0", "kernel") == ["aten::mm"]

    # the cell reports carry the profile's op table, as `%%neuron profile` puts it on a report
    doc = json.loads((tmp_path / "run.json").read_text())
    assert doc["traces"] == [str(folder / f"cell-00{k}.json") for k in (1, 2, 3)]
    assert [c["trace"] for c in doc["cells"]] == doc["traces"]
    rows = [[(r["op"], r["kind"], r["calls"]) for r in c["report"]["profiled"]["rows"]] for c in doc["cells"]]
    assert ("aten::mm", "native", 1) in rows[0] and ("aten::atan2", "fallback", 1) in rows[1]
    assert doc["cells"][1]["report"]["profiled"]["trace_path"] == str(folder / "cell-002.json")
    assert "\n    trace: " + str(folder / "cell-002.json") in text  # the cell's printed report says where its is


def test_a_trace_folder_that_cannot_be_made_is_bad_usage_before_anything_runs(tmp_path):
    (tmp_path / "taken").write_text("a file, not a folder")
    code, text = run(tmp_path, "x = 1\n", "--trace", "taken/traces")
    assert code == options.EXIT_USAGE, text
    assert text.startswith("neuron-lab run: --trace taken/traces: cannot create the folder: "), text
    assert "starting a kernel" not in text


OWN_PROFILERS = """
    import os
    import torch
    import neuron_lab
    a = torch.ones(16, 16).to("neuron")
    c = a @ a
    # %%
    with neuron_lab.profile() as r:
        d = a @ a
    assert [row.op for row in r.profiled.rows] == ["aten::mm"], r.profiled.rows
    # %%
    with torch.profiler.profile() as p:
        e = a @ a
    assert "aten::mm" in p.key_averages().table()
    # %%
    os.makedirs("out/cell-004.json/in-the-way")  # where this cell's trace goes: the profiler cannot write it
    f = a @ a
    # %%
    g = a @ a
"""


def test_a_cell_that_runs_its_own_profiler_runs_as_without_trace_and_the_runner_says_it_wrote_none(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    for name in ("cell-007.json", "cell-002.rank1.json", "cell-1.json", "notes.json"):  # a longer earlier run's
        (out / name).write_text("{}")
    code, text = run(tmp_path, OWN_PROFILERS, "--trace", "out", "--json", "run.json")
    assert code == 0, text  # as without --trace: each cell's own profiler ran, and saw its op
    assert "\ncell 2: no trace (the cell ran its own profiler)\n" in text
    assert "\ncell 3: no trace (the cell ran its own profiler)\n" in text
    assert f"\ncell 4: no trace (cannot write {out / 'cell-004.json'}: " in text
    assert not [line for line in text.splitlines() if line.startswith(("cell 1:", "cell 5:"))]
    assert f"\ntraces: 2 Chrome traces in {out}{os.sep} (cell-001.json … cell-005.json); 3 cells without one " \
           "(said above); open one in https://ui.perfetto.dev\n" in text
    # the earlier run's traces are gone, the files the runner does not name kept
    assert sorted(p.name for p in out.iterdir() if p.is_file() and not p.name.endswith(".tmp")) == \
        ["cell-001.json", "cell-005.json", "cell-1.json", "notes.json"]
    doc = json.loads((tmp_path / "run.json").read_text())
    assert [c["no_trace"] for c in doc["cells"]][:3] == [None, OWN_PROFILER, OWN_PROFILER]
    assert doc["traces"] == [str(out / "cell-001.json"), str(out / "cell-005.json")]
    # the tracer took up again after the raw profiler: the last cell's report has its op table
    assert [r["op"] for r in doc["cells"][4]["report"]["profiled"]["rows"]] == ["aten::mm"]
    assert doc["cells"][2]["report"]["profiled"] is None
    # the cell whose trace could not be written keeps its op table, and its report names no file
    assert doc["cells"][3]["report"]["profiled"]["trace_path"] is None
    assert [r["op"] for r in doc["cells"][3]["report"]["profiled"]["rows"]] == ["aten::mm"]
    cell_4 = text[text.index("\n[4/5] "):text.index("\ncell 4: no trace")]
    assert "profile: 1 op" in cell_4 and "trace: " not in cell_4


def test_the_tracer_gives_way_in_a_shell_and_leaves_with_the_extension(shell, tmp_path):
    run_cell(shell, "import torch, neuron_lab\na = torch.ones(8, 8).to('neuron')")
    tracer = CellTracer.of(session_of(shell))
    cells = ["c = a @ a", "%%neuron profile\nd = a @ a", "with neuron_lab.profile() as r:\n    e = a @ a",
             "with torch.profiler.profile():\n    f = a @ a", "g = a @ a"]
    wrote, why = [], []
    for k, code in enumerate(cells):
        tracer.arm(str(tmp_path / f"{k}.json"))
        run_cell(shell, code)
        wrote.append((tmp_path / f"{k}.json").is_file())
        why.append(tracer.missing)
    assert wrote == [True, False, False, False, True]
    assert why == [None, OWN_PROFILER, OWN_PROFILER, OWN_PROFILER, None]
    assert [r.op for r in shell.user_ns["r"].profiled.rows] == ["aten::mm"]
    # %reload_ext: the old session's tracer is dropped with it (no IPython event keeps it)
    gone = weakref.ref(tracer)
    del tracer
    run_cell(shell, "%reload_ext neuron_lab")
    gc.collect()
    assert gone() is None


def test_a_trace_folder_the_runner_cannot_write_into_is_bad_usage_even_for_root():
    with pytest.raises(InputError) as e:  # /proc: root passes os.access there, but no file can be made
        traces.prepare("/proc")
    assert str(e.value) == "--trace /proc: cannot write into /proc: No such file or directory"


TWO_RANKS = """
    import torch
    import torch.distributed as dist
    import torch_neuronx

    dist.init_process_group(backend="neuron")
    rank = dist.get_rank()
    dev = torch.device("neuron", torch.neuron.current_device())
    # %%
    x = torch.full((64, 64), float(rank + 1)).to(dev)
    y = x @ x
    dist.all_reduce(y)
    # %%
    if rank == 1:  # its own profiler: no trace from rank 1, rank 0's is the cell's
        with torch.profiler.profile():
            z = x @ x
    # %%
    dist.destroy_process_group()
"""


@compiled_only
def test_two_ranks_merge_into_one_trace_with_a_process_and_a_device_lane_per_rank(tmp_path):
    code, text = run(tmp_path, TWO_RANKS, "--nproc", "2", "--trace", "out")
    assert code == 0, text
    out = tmp_path / "out"
    assert {"cell-002.json", "cell-002.rank0.json", "cell-002.rank1.json"} <= {p.name for p in out.iterdir()}
    assert f"\ntraces: 4 Chrome traces in {out}{os.sep} (cell-001.json … cell-004.json); 1 cell without one on " \
           "a rank (said above); " in text
    assert "\ncell 3: no trace on rank 1 (the cell ran its own profiler)\n" in text
    assert "cell-003.rank1.json" not in {p.name for p in out.iterdir()}
    evs = events(out / "cell-002.json")
    names = processes(evs)
    assert sorted(n for n in names.values() if n.startswith("rank ") and n.count(" ") == 1) == ["rank 0", "rank 1"]
    for r in (0, 1):
        # each rank's matmul and its all_reduce (from call to completion) on its own device
        assert on(evs, f"rank {r} neuron:{r}", "kernel") == ["aten::mm", "c10d::all_reduce.sum"]
        assert any("all_reduce" in n for n in on(evs, f"rank {r}")), on(evs, f"rank {r}")
    # one time axis: a collective ends on no rank before every rank has entered it, so the two overlap
    for name in ("gloo:all_reduce", "c10d::all_reduce.sum"):
        spans = [next((e["ts"], e["ts"] + e["dur"]) for e in evs if e.get("ph") == "X" and e["name"] == name
                      and names[e["pid"]].startswith(f"rank {r}")) for r in (0, 1)]
        assert max(s for s, _ in spans) < min(e for _, e in spans), (name, spans)


def test_merge_puts_ranks_with_different_bases_on_one_axis_and_keeps_their_flows_apart():
    def trace(base: int, pid: int, device: int) -> dict[str, Any]:
        return {"baseTimeNanoseconds": base, "traceEvents": [
            {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "python"}},
            {"ph": "M", "name": "process_labels", "pid": pid, "tid": 0, "args": {"labels": "CPU"}},
            {"ph": "M", "name": "process_name", "pid": device, "tid": 0, "args": {"name": f"neuron:{device}"}},
            {"ph": "X", "name": "aten::mm", "pid": pid, "tid": pid, "ts": 10.0, "dur": 5.0},
            {"ph": "X", "name": "aten::mm", "pid": device, "tid": 0, "ts": 11.0, "dur": 2.0},
            {"ph": "s", "id": 7, "pid": pid, "tid": pid, "ts": 10.0, "name": "ac2g"},
            {"ph": "f", "id": 7, "pid": device, "tid": 0, "ts": 11.0, "name": "ac2g", "bp": "e"}]}

    merged = merge.merge({1: trace(2_000_000, 200, 1), 0: trace(1_000_000, 100, 0)})
    evs = merged["traceEvents"]
    assert merged["baseTimeNanoseconds"] == 1_000_000
    names = processes(evs)
    assert sorted(names.values()) == ["rank 0", "rank 0 neuron:0", "rank 1", "rank 1 neuron:1"]
    by_name = {n: pid for pid, n in names.items()}
    starts = {names[e["pid"]]: e["ts"] for e in evs if e["ph"] == "X"}
    assert starts == {"rank 0": 10.0, "rank 0 neuron:0": 11.0, "rank 1": 1010.0, "rank 1 neuron:1": 1011.0}
    flows = {(names[e["pid"]], e["ph"]): e["id"] for e in evs if e["ph"] in "sf"}
    assert flows[("rank 0", "s")] == flows[("rank 0 neuron:0", "f")] != flows[("rank 1", "s")] \
        == flows[("rank 1 neuron:1", "f")]
    order = {e["pid"]: e["args"]["sort_index"] for e in evs if e.get("name") == "process_sort_index"}
    assert sorted(names.values(), key=lambda n: order[by_name[n]]) == \
        ["rank 0", "rank 0 neuron:0", "rank 1", "rank 1 neuron:1"]
