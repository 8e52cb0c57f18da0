"""`neuron-lab run --nproc N`: a script on N ranks started as torchrun starts them, one kernel each, in step.

Each test runs the real command on a tiny `# %%` script written here and checks what a user or a CI job
relies on: the per-cell lines across ranks, the merged summary, the gates over every rank, the exit code
and the --json/--html/--output files. The ranks' collectives are the emulator's `neuron` process group
over gloo, so the counts asserted are exact. A run that outlives its bound is killed with its kernels
(each kernel exits when its parent does).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import nbformat
import psutil
import pytest
from conftest import core, neuron_lab_run

from neuron_lab.runner import main, options
from neuron_lab.session import launch

RUN_TIMEOUT = 240  # seconds for one whole `neuron-lab run --nproc`
MARKER = "NEURON_LAB_TEST_RUN"  # set in a run's environment: its processes can be found after it exited
COMPILED = core() == "compiled"  # the pure-Python core has one device: every rank is on neuron:0 there


def dev(rank: int) -> str:
    return f"neuron:{rank if COMPILED else 0}"


def script(tmp: Path, name: str, text: str) -> Path:
    path = tmp / name
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def run(tmp: Path, *args: str) -> tuple[int, str]:
    return neuron_lab_run(tmp, *args, timeout=RUN_TIMEOUT)


def load(path: Path) -> Any:
    return json.loads(path.read_text())


def calls(report: dict[str, Any], kind: str = "collective") -> dict[str, int]:
    return {r["op"]: r["count"] for r in report["ops_not_native"] if r["kind"] == kind}


TRAIN = """
    import torch
    import torch.distributed as dist
    import torch_neuronx
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group(backend="neuron")
    rank = dist.get_rank()
    dev = torch.device("neuron", torch.neuron.current_device())
    print("rank", rank, "of", dist.get_world_size(), "on", dev, "of", torch.neuron.device_count())
    # %%
    x = torch.full((256,), float(rank + 1)).to(dev)
    dist.all_reduce(x)
    print("sum", x[0].item())
    # %%
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(16, 4).to(dev), device_ids=[dev.index])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(torch.ones(8, 16).to(dev) * (rank + 1)).sum()
    loss.backward()
    opt.step()
    # %%
    dist.destroy_process_group()
"""


def test_two_ranks_all_reduce_and_a_ddp_step_report_per_rank_and_merged(tmp_path):
    path = script(tmp_path, "train.py", TRAIN)
    code, text = run(tmp_path, path.name, "--nproc", "2", "--backend", "emulator", "--json", "run.json",
                     "--html", "run.html", "--output", "run.ipynb")
    assert code == 0, text
    assert text.startswith("neuron-lab run train.py (script, 4 code cells) on 2 ranks: starting 2 kernels\n")
    for r in range(2):
        assert re.search(rf"^rank {r} kernel ready · neuron_lab \S+: emulator backend.* · device {dev(r)} · ", text,
                         re.M), text
    # Cell 2: one all_reduce per rank, at the script's line, each rank on its own device.
    assert re.search(r"^\[2/4\] train\.py:10 ok \S+ \S+ · 2 ranks · slowest rank [01] \(.*, skew .*\) · "
                     r"2 collective calls · no CPU fallbacks$", text, re.M), text
    assert re.search(rf"^    0     {dev(0)}  .* 1 call, 1\.00 KiB, ", text, re.M), text
    assert re.search(rf"^    1     {dev(1)}  .* 1 call, 1\.00 KiB, ", text, re.M), text
    assert "\n            at train.py:12: dist.all_reduce(x)  (2×)\n" in text
    # What the ranks printed, under each cell: a line naming its rank per rank, a line alike once with its ranks.
    said = [f"rank {r} of 2 on {dev(r)} of {2 if COMPILED else 1}" for r in range(2)]
    assert f"\n    [stdout:0] {said[0]}\n    [stdout:1] {said[1]}\n" in text
    assert "\n    [ranks 0-1] sum 3.0\n" in text
    # Cell 3: DDP's construction (2 broadcasts, 1 all_gather per rank) and its gradient all_reduce per rank.
    assert re.search(r"^\[3/4\] train\.py:14 ok .* · 8 collective calls · no CPU fallbacks$", text, re.M), text
    assert "\n            at train.py:19: loss.backward()  (2×)\n" in text
    summary = text[text.index("summary: 4 of 4 cells ran on 2 ranks in "):]
    assert re.search(r"^  neuron_lab train\.py · 2 ranks · slowest rank [01] .* · 10 collective calls · "
                     r"no CPU fallbacks$", summary, re.M), summary
    for r in range(2):
        assert re.search(rf"^  {r}     {dev(r)}  .* 5 calls, 1\.59 KiB, ", summary, re.M), summary
    assert re.search(r"^      c10d::all_reduce\.sum +4× ", summary, re.M), summary
    assert "\n  errors: none\n" in summary and summary.rstrip().endswith("exit 0: " + options.MEANINGS[0])

    doc = load(tmp_path / "run.json")
    assert doc["nproc"] == 2 and doc["exit_code"] == 0 and doc["kernel_errors"] == []
    assert [c["label"] for c in doc["cells"]] == ["train.py:1", "train.py:10", "train.py:14", "train.py:21"]
    assert [c["status"] for c in doc["cells"]] == ["ok"] * 4
    ranks = doc["cells"][1]["ranks"]["ranks"]
    assert [(r["rank"], r["report"]["device"], r["error"]) for r in ranks] == [(0, dev(0), None), (1, dev(1), None)]
    assert all(re.fullmatch(r"kernel pid \d+", r["where"]) for r in ranks) and ranks[0]["where"] != ranks[1]["where"]
    assert [calls(r["report"]) for r in ranks] == [{"c10d::all_reduce.sum": 1}] * 2
    assert [calls(r["report"]) for r in doc["cells"][2]["ranks"]["ranks"]] == \
        [{"c10d::all_reduce.sum": 1, "c10d::broadcast": 2, "c10d::all_gather": 1}] * 2
    assert [[rec["status"] for rec in c["records"]] for c in doc["cells"]] == [["ok", "ok"]] * 4
    whole = doc["summary"]["ranks"]
    assert whole["title"] == "train.py" and whole["slowest"] in (0, 1)
    assert [sum(calls(r["report"]).values()) for r in whole["ranks"]] == [5, 5]

    # --output and --html hold rank 0's notebook, with every rank's stdout as the run printed it: the script saw
    # torchrun's variables and its own device.
    nb = nbformat.read(tmp_path / "run.ipynb", as_version=4)
    assert nb.cells[0].outputs[0]["text"] == f"[stdout:0] {said[0]}\n[stdout:1] {said[1]}\n"
    assert nb.cells[1].outputs[0]["text"] == "[ranks 0-1] sum 3.0\n"
    page = (tmp_path / "run.html").read_text()
    assert "neuron-lab run --nproc 2 train.py" in page and 'class="neuron-lab-ranks"' in page
    assert page.count('class="neuron-lab-ranks"') == 5  # the run's table, then one per cell
    assert "The cells below are rank 0's; their printed lines are every rank's, collapsed." in page


P2P = """
    import torch, torch.distributed as dist
    import torch_neuronx
    dist.init_process_group(backend="neuron")
    x = torch.ones(8).to(device)
    if dist.get_rank() == 0:
        dist.send(x, 1)
    else:
        dist.recv(x, 0)
    dist.destroy_process_group()
"""


def test_the_unsupported_gate_fails_on_send_and_recv_naming_lines_and_ranks(tmp_path):
    path = script(tmp_path, "p2p.py", P2P)
    code, text = run(tmp_path, path.name, "--nproc", "2", "--fail-on-unsupported", "--json", "run.json")
    assert code == options.EXIT_GATE, text
    assert re.search(r"^\[1/1\] p2p\.py:1 ok .* · 2 collective calls · no CPU fallbacks · 2 unsupported calls$",
                     text, re.M), text
    gate_line = next(line for line in text.splitlines() if line.startswith("  FAIL  --fail-on-unsupported: "))
    assert gate_line.startswith("  FAIL  --fail-on-unsupported: 2 unsupported calls of 2 ops: c10d::"), gate_line
    # The ops come slowest first: send and recv in either order.
    assert "c10d::send ×1 at p2p.py:6 (" in gate_line and "c10d::recv ×1 at p2p.py:8 (" in gate_line, gate_line
    assert text.rstrip().endswith("exit 3: a gate failed: --fail-on-unsupported")
    gate = load(tmp_path / "run.json")["gates"][0]
    assert (gate["passed"], gate["measured"], gate["blamed"]) == (False, "2 calls", ["rank 0 p2p.py:1",
                                                                                   "rank 1 p2p.py:1"])


RAISES = """
    import torch, torch.distributed as dist
    import torch_neuronx
    dist.init_process_group(backend="neuron")
    rank = dist.get_rank()
    # %%
    x = torch.ones(8).to(device)
    if rank == 1:
        raise ValueError("rank 1 has a bad shard")
    dist.all_reduce(x)  # rank 0 waits here for rank 1, which never comes
    # %%
    print("never")
"""


def left_running(marker: str, deadline_s: float) -> list[str]:
    """The processes that still carry ``marker`` in their environment (the run's kernels inherit it) once
    ``deadline_s`` has passed, or as soon as there are none."""
    deadline = time.monotonic() + deadline_s
    while True:
        left = []
        for p in psutil.process_iter(["pid", "cmdline"]):
            try:
                if p.environ().get(MARKER) == marker and p.status() != psutil.STATUS_ZOMBIE:
                    left.append(f"pid {p.pid}: {' '.join(p.info['cmdline'] or [])[:200]}")
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.2)


def test_a_rank_that_raises_fails_the_run_naming_it_and_the_waiting_rank_is_stopped(tmp_path, monkeypatch):
    path = script(tmp_path, "bad.py", RAISES)
    marker = uuid.uuid4().hex
    monkeypatch.setenv(MARKER, marker)  # neuron-lab run and every process it starts inherit it
    code, text = run(tmp_path, path.name, "--nproc", "2", "--json", "run.json")
    assert code == options.EXIT_CELL_ERROR, text
    left = left_running(marker, deadline_s=10)
    assert not left, f"still running 10 s after neuron-lab run exited: {left}"
    stopped = "stopped: rank 1 failed (error in bad.py:5); a collective here would wait for it forever"
    assert re.search(r"^\[2/3\] bad\.py:5 error on rank 1, stopped on rank 0 \S+ \S+ · 2 ranks · .* · "
                     r"1 rank failed \(1\) · 1 rank stopped \(0\)$", text, re.M), text  # a stopped rank did not fail
    assert re.search(rf"^    1     {dev(1)} .* ValueError: rank 1 has a bad shard$", text, re.M), text
    assert re.search(rf"^    0 +{re.escape(stopped)}$", text, re.M), text
    assert "\n    rank 1:\n" in text and "ValueError: rank 1 has a bad shard" in text
    assert re.search(r"^        File bad\.py, line 8$", text, re.M) and "Cell In[" not in text, text
    assert re.search(r"^        -+> 8 +raise ValueError\(\"rank 1 has a bad shard\"\)$", text, re.M), text
    summary = text[text.index("summary: 2 of 3 cells ran on 2 ranks"):]
    assert "\n  error on rank 1 in bad.py:5 [2/3]: ValueError: rank 1 has a bad shard\n" in summary
    assert f"\n  stopped on rank 0 in bad.py:5 [2/3]: {stopped}\n" in summary
    assert "\n  not run: 1 cell ([3/3])\n" in summary
    doc = load(tmp_path / "run.json")
    assert doc["summary"]["failure"] == "rank 1 failed (error in bad.py:5)"
    assert [rec["status"] for rec in doc["cells"][1]["records"]] == ["stopped", "error"]
    assert [rec["status"] for rec in doc["cells"][2]["records"]] == ["not run", "not run"]
    assert doc["cells"][1]["ranks"]["ranks"][1]["report"]["error"] == "ValueError: rank 1 has a bad shard"


HANGS = """
    import time, torch, torch.distributed as dist
    import torch_neuronx
    dist.init_process_group(backend="neuron")
    x = torch.ones(4).to(torch.device("neuron", torch.neuron.current_device()))
    # %%
    if dist.get_rank() == 1:
        time.sleep(120)
    else:
        dist.all_reduce(x)
    # %%
    print("never")
"""


def test_a_hung_cell_prints_where_each_rank_was_interrupts_every_rank_and_exits_5(tmp_path, monkeypatch):
    """Rank 1 skips the all_reduce and sleeps: past --timeout, the hang view (the one `%%neuron ranks` shows) on
    stderr and in --json names rank 0's all_reduce and its line and rank 1's line; every rank is interrupted (the
    emulated collective wakes on it) and nothing is left running."""
    path = script(tmp_path, "hang.py", HANGS)
    marker = uuid.uuid4().hex
    monkeypatch.setenv(MARKER, marker)
    code, text = run(tmp_path, path.name, "--nproc", "2", "--timeout", "10", "--json", "run.json")  # as the notebook's
    assert code == options.EXIT_HUNG, text
    assert not left_running(marker, deadline_s=10)
    view = ["rank 0 waiting in all_reduce (group 0 of 2 ranks, [4] float32) at hang.py:9: dist.all_reduce(x)",
            "rank 1 never reached all_reduce: at hang.py:7: time.sleep(120)"]
    said = ("neuron-lab run: [2/3] hang.py:5 ran past --timeout 10 s; every rank still in it was interrupted. "
            "where the ranks were at the deadline:\n" + "".join(f"    {line}\n" for line in view))
    assert said in text, text
    doc = load(tmp_path / "run.json")
    assert doc["exit_code"] == options.EXIT_HUNG
    assert doc["summary"]["hang"] == {"cell": 2, "lines": view}
    assert doc["cells"][1]["ranks"]["ranks"][0]["stuck"]["collective"]["op"] == "all_reduce"
    assert [rec["status"] for rec in doc["cells"][2]["records"]] == ["not run", "not run"]
    assert all(rank["report"] is not None for rank in doc["cells"][1]["ranks"]["ranks"])  # interrupted, not killed


def test_a_hung_notebook_cell_names_the_notebooks_lines(tmp_path):
    nb = nbformat.v4.new_notebook()
    chunks = textwrap.dedent(HANGS).strip().split("# %%\n")
    nb.cells = [nbformat.v4.new_code_cell(chunk.strip()) for chunk in chunks]
    nbformat.write(nb, tmp_path / "hang.ipynb")
    code, text = run(tmp_path, "hang.ipynb", "--nproc", "2", "--timeout", "10")
    assert code == options.EXIT_HUNG, text
    assert ("neuron-lab run: [2/3] In[2] ran past --timeout 10 s; every rank still in it was interrupted. where the "
            "ranks were at the deadline:\n"
            "    rank 0 waiting in all_reduce (group 0 of 2 ranks, [4] float32) at In[2] line 4: dist.all_reduce(x)\n"
            "    rank 1 never reached all_reduce: at In[2] line 2: time.sleep(120)\n") in text, text


def test_a_notebook_whose_ranks_cell_fails_exits_with_it_and_leaves_no_engine_or_controller(tmp_path, monkeypatch):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in (
        "%load_ext neuron_lab", "%neuron ranks start 2 --timeout 60",
        "%%neuron ranks --timeout 60\nimport torch.distributed as dist\nif dist.get_rank() == 1:\n"
        "    raise ValueError('bad shard')\n", "print('never')")]
    nbformat.write(nb, tmp_path / "ranks.ipynb")
    marker = uuid.uuid4().hex
    monkeypatch.setenv(MARKER, marker)  # the kernel, and the engines and controller it starts, inherit it
    code, text = run(tmp_path, "ranks.ipynb")
    assert code == options.EXIT_CELL_ERROR, text
    assert "\n    RanksFailed: 1 rank of 2 failed in In[3]\n      rank 1: ValueError: bad shard\n" in text, text
    left = left_running(marker, deadline_s=10)
    assert not left, f"still running 10 s after neuron-lab run exited: {left}"


RANKS_CELL = ("%%neuron ranks --timeout 60\nimport torch, torch.distributed as dist\n"
              "x = torch.ones(1 << 18).to(torch.device('neuron', torch.neuron.current_device()))\n"
              "y = x.atan2(x)\npair = dist.new_group([0, 1])\ndist.barrier(group=pair)\n")


def test_a_notebooks_ranks_cells_are_judged_and_summarised_like_nproc_ranks(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in (
        "%load_ext neuron_lab", "%neuron ranks start 2 --timeout 60", RANKS_CELL, "%neuron ranks stop")]
    nbformat.write(nb, tmp_path / "ranks.ipynb")
    code, text = run(tmp_path, "ranks.ipynb", "--fail-on-fallback", "--fail-on-unsupported", "--max-peak-memory",
                     "1MiB", "--json", "run.json")
    assert code == options.EXIT_GATE, text
    assert re.search(r"^\[3/4\] In\[3\] ok .* · 2 ranks · .* · 2 CPU fallback calls · 2 unsupported calls$", text,
                     re.M), text
    assert "\n    summed over 2 ranks:\n" in text, text
    assert re.search(r"^  neuron_lab %%neuron ranks In\[3\] · 2 ranks · ", text, re.M), text
    assert re.search(r"^  peak device memory: 2\.00 MiB of .*, in rank [01] In\[3\]$", text, re.M), text
    assert "\n  FAIL  --fail-on-fallback: 1 op ran on the CPU (2 calls): aten::atan2.out ×2 at In[3] line 4 " in text
    assert "\n  FAIL  --fail-on-unsupported: 2 unsupported calls of 1 op: c10d::barrier ×2 at In[3] line 6 " in text
    assert "--max-peak-memory 1.00 MiB: 2 cells took it above the limit: rank 0 In[3] 0 B → 2.00 MiB, rank 1 In[3]" \
        in text, text
    doc = load(tmp_path / "run.json")
    [window] = doc["cells"][2]["ranks"]
    assert [(r["rank"], r["report"]["fallback_calls"]) for r in window["ranks"]] == [(0, 1), (1, 1)]
    assert doc["summary"]["peak_memory"]["bytes"] >= 2 << 20
    assert [r["report"]["fallback_calls"] for r in doc["summary"]["ranks"]["ranks"]] == [1, 1]
    assert {g["gate"].split()[0]: g["blamed"] for g in doc["gates"]}["--fail-on-unsupported"] == ["rank 0 In[3]",
                                                                                                 "rank 1 In[3]"]


def test_a_ranks_cell_leaves_no_empty_output_per_rank_in_the_notebook_or_page(tmp_path):
    """Each rank's compile progress line (AdamW loads PyTorch's compiler on each engine, longer than the line's 0.7 s
    here) used to leave an ``[output:N]`` line per rank in the saved notebook and its page."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in (
        "%load_ext neuron_lab", "%neuron ranks start 2 --timeout 60",
        "%%neuron ranks\nimport torch\nopt = torch.optim.AdamW([torch.ones(2, device=device, requires_grad=True)])",
        "%neuron ranks stop")]
    nbformat.write(nb, tmp_path / "adamw.ipynb")
    code, text = run(tmp_path, "adamw.ipynb", "--output", "out.ipynb", "--html", "out.html")
    assert code == options.EXIT_OK, text
    outputs = nbformat.read(tmp_path / "out.ipynb", as_version=4).cells[2].outputs
    assert [o.output_type for o in outputs] == ["execute_result"], outputs
    assert "[output:" not in (tmp_path / "out.html").read_text()


DIES = """
    import os, time
    import torch
    rank = int(os.environ["RANK"])  # no process group: each rank is an independent copy, as under torchrun
    x = torch.ones(4).to(device)
    # %%
    if rank == 1:
        os.kill(os.getpid(), 9)
    while True:  # rank 0 waits for rank 1 forever, as it would in a collective
        time.sleep(0.05)
"""


def test_a_rank_whose_kernel_dies_exits_4_and_the_other_rank_is_stopped(tmp_path):
    path = script(tmp_path, "dies.py", DIES)
    code, text = run(tmp_path, path.name, "--nproc", "2", "--json", "run.json")
    assert code == options.EXIT_KERNEL, text
    assert re.search(r"^\[1/2\] dies\.py:1 ok .* · 2 ranks · slowest rank [01] \(.*\) · no CPU fallbacks$", text,
                     re.M), text  # no collective made: none counted
    assert re.search(r"^\[2/2\] dies\.py:5 kernel died on rank 1, stopped on rank 0 ", text, re.M), text
    assert "\nkernel failed on rank 1: the kernel died while running cell [2/2]\n" in text
    assert text.rstrip().endswith("exit 4: " + options.MEANINGS[4])
    doc = load(tmp_path / "run.json")
    assert [(r["rank"], r["report"]["device"]) for r in doc["cells"][0]["ranks"]["ranks"]] == [(0, dev(0)),
                                                                                             (1, dev(1))]
    assert [rec["status"] for rec in doc["cells"][1]["records"]] == ["stopped", "kernel died"]
    assert [(e["rank"], e["error"]) for e in doc["kernel_errors"]] == [(1, "the kernel died while running cell [2/2]")]


FOUR = """
    import os
    import torch, torch.distributed as dist
    import torch_neuronx
    dist.init_process_group(backend="neuron")
    rank = dist.get_rank()
    # %%
    x = torch.full((4,), float(rank)).to(device)
    dist.all_reduce(x)
    gathered = torch.zeros(16).to(device)
    dist.all_gather_into_tensor(gathered, x)
    assert x.tolist() == [6.0] * 4 and gathered.tolist() == [6.0] * 16
    facts = (rank, os.environ["LOCAL_RANK"], os.environ["WORLD_SIZE"], torch.neuron.device_count(), str(x.device))
    print(facts)
    # %%
    dist.destroy_process_group()
"""


def test_four_ranks_each_on_its_own_device_with_exact_collectives(tmp_path):
    path = script(tmp_path, "four.py", FOUR)
    code, text = run(tmp_path, path.name, "--nproc", "4", "--json", "run.json", "--max-peak-memory", "1MiB")
    assert code == 0, text
    assert re.search(r"^\[2/3\] four\.py:6 ok .* · 4 ranks · slowest rank [0-3] .* · 8 collective calls · "
                     r"no CPU fallbacks$", text, re.M), text
    for r in range(4):
        assert re.search(rf"^    {r}     {dev(r)}  .* 2 calls, 32 B, ", text, re.M), text
    assert "\n            at four.py:8: dist.all_reduce(x)  (4×)\n" in text
    assert "\n            at four.py:10: dist.all_gather_into_tensor(gathered, x)  (4×)\n" in text
    assert re.search(r"^  pass  --max-peak-memory 1\.00 MiB: the highest peak was \S+ \S+$", text, re.M), text
    doc = load(tmp_path / "run.json")
    ranks = doc["cells"][1]["ranks"]["ranks"]
    assert [(r["rank"], r["report"]["device"]) for r in ranks] == [(r, dev(r)) for r in range(4)]
    assert [calls(r["report"]) for r in ranks] == [{"c10d::all_reduce.sum": 1, "c10d::all_gather_into_tensor": 1}] * 4
    assert re.search(r"in rank [0-3] four\.py:6$", doc["gates"][0]["measured"]), doc["gates"]


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5"])
def test_nproc_must_be_a_whole_number_of_ranks(tmp_path, capsys, value):
    path = script(tmp_path, "a.py", "print(1)\n")
    with pytest.raises(SystemExit) as e:
        main.main([str(path), "--nproc", value])
    assert e.value.code == options.EXIT_USAGE
    err = capsys.readouterr().err
    assert f"argument --nproc/--nproc-per-node: {value!r} is not a number of ranks (a whole number, at least 1)" in err


def test_each_rank_gets_torchruns_variables_and_the_launchers_store():
    envs = launch.rank_envs({"PATH": "/bin"}, 3, port=29511)
    assert [(e["RANK"], e["LOCAL_RANK"], e["ROLE_RANK"]) for e in envs] == [(str(r),) * 3 for r in range(3)]
    assert {(e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"], e["MASTER_ADDR"], e["MASTER_PORT"], e["OMP_NUM_THREADS"],
             e["PATH"], e["TORCHELASTIC_RUN_ID"], e["TORCHELASTIC_USE_AGENT_STORE"]) for e in envs} == \
        {("3", "3", "127.0.0.1", "29511", "1", "/bin", envs[0]["TORCHELASTIC_RUN_ID"], "True")}
    assert launch.rank_envs({"OMP_NUM_THREADS": "4"}, 2, port=29511)[1]["OMP_NUM_THREADS"] == "4"


def test_the_launchers_store_listens_before_any_rank_starts_and_every_rank_is_its_client(tmp_path):
    """The port is the store's from the moment it is chosen, so no other process can take it before rank 0 starts
    (a free port picked ahead and bound later by rank 0 was taken once in CI: EADDRINUSE)."""
    import socket

    store = launch.AgentStore()
    with socket.socket() as s, pytest.raises(OSError):  # already listening: nobody else gets the port
        s.bind((launch.MASTER_ADDR, store.port))
    code = textwrap.dedent("""
        import os, torch.distributed as dist
        dist.init_process_group(backend="gloo")
        dist.barrier()
        print(dist.get_rank(), dist.get_world_size())
        dist.destroy_process_group()
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
             for env in launch.rank_envs(dict(os.environ), 2, port=store.port)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0] and [o.split() for o in outs] == [["0", "2"], ["1", "2"]]


HOSTS = """
    import os
    import torch
    import torch.distributed as dist
    dist.init_process_group(backend="neuron")
    x = torch.ones(2, device="neuron") * (dist.get_rank() + 1)
    dist.all_reduce(x)
    print("placed", dist.get_rank(), os.environ["LOCAL_RANK"], os.environ["GROUP_RANK"], os.environ["NEURON_LAB_HOST"],
          os.environ["NEURON_RT_VISIBLE_CORES"], os.environ["NEURON_RT_ROOT_COMM_ID"], x.device, int(x[0]))
"""


def test_two_emulated_hosts_of_two_ranks_get_torchruns_ranks_each_its_instance_shape_and_are_named_in_the_report(
        tmp_path):
    """One run of 4 kernels for both: the hosts' ranks and names, and each host's own instance shape."""
    path = script(tmp_path, "hosts.py", HOSTS)
    code, text = run(tmp_path, path.name, "--nnodes", "2", "--nproc-per-node", "2",
                     "--instance", "trn2.48xlarge,trn1.32xlarge", "--json", "run.json")
    assert code == 0, text
    assert "on 4 ranks (2 emulated hosts × 2): starting 4 kernels" in text
    for r in range(4):
        assert re.search(rf"^    {r}     host{r // 2}  {dev(r % 2)}  .* 1 call, 8 B, ", text, re.M), text
    # trn2.48xlarge: 24 GiB per logical core at LNC=2; trn1.32xlarge: 16 GiB per NeuronCore
    for rank, gib in enumerate([24, 24, 16, 16]):
        assert re.search(rf"^rank {rank} kernel ready · .* · device {re.escape(dev(rank % 2))} · {gib}\.00 GiB · ",
                         text, re.M), text
    doc = load(tmp_path / "run.json")
    ranks = doc["cells"][0]["ranks"]["ranks"]
    assert [(r["rank"], r["host"]) for r in ranks] == [(r, f"host{r // 2}") for r in range(4)]
    assert [(r["host"], r["report"]["memory"]["capacity"] >> 30) for r in ranks] == [
        ("host0", 24), ("host0", 24), ("host1", 16), ("host1", 16)]
    assert doc["nproc"] == 4


PLANTED = """
    import os
    if os.environ.get("RANK") == "1":  # one rank's host set up another way: its runtime logs differently
        os.environ["NEURON_RT_LOG_LEVEL"] = "INFO"
"""


def test_ranks_that_differ_stop_the_run_before_init_process_group_with_the_preflight_table(tmp_path, monkeypatch):
    startup = tmp_path / "ipython" / "profile_default" / "startup"  # the kernels' IPython (conftest's IPYTHONDIR)
    startup.mkdir(parents=True)
    script(startup, "00-planted.py", PLANTED)
    path = script(tmp_path, "hosts.py", HOSTS)
    marker = uuid.uuid4().hex
    monkeypatch.setenv(MARKER, marker)
    monkeypatch.delenv("NEURON_RT_LOG_LEVEL", raising=False)
    code, text = run(tmp_path, path.name, "--nproc", "2")
    assert code == options.EXIT_KERNEL, text
    lines = text.splitlines()
    head = lines.index("the ranks differ, so none ran the program:")
    assert lines[head + 1] == "neuron_lab preflight: 2 ranks differ in NEURON_RT_LOG_LEVEL"
    rows = [line.split() for line in lines[head + 2:head + 5]]
    assert [[row[0], *row[6:]] for row in rows] == [["rank", "NEURON_RT_ROOT_COMM_ID", "NEURON_RT_LOG_LEVEL"],
                                           ["0", rows[1][6], "-"], ["1", rows[1][6], "INFO"]]
    assert re.fullmatch(r"127\.0\.0\.1:\d+", rows[1][6]) and rows[1][6] == rows[2][6]  # one group, alike on each
    assert "placed" not in text  # no cell ran: init_process_group was never called
    assert not left_running(marker, deadline_s=10)


def test_an_instance_the_emulator_does_not_know_or_one_too_many_is_a_usage_error(tmp_path, capsys):
    """Refused before any kernel starts: in this process, as the other usage errors."""
    path = script(tmp_path, "hosts.py", HOSTS)
    assert main.main([str(path), "--nnodes", "2", "--instance", "trn2.48xlarge,trn1.32xlarge,trn1.2xlarge"]) == \
        options.EXIT_USAGE
    said = "neuron-lab run: --instance: 3 instances for 2 hosts: give one for all, or one per host"
    assert said in capsys.readouterr().err
    assert main.main([str(path), "--nnodes", "2", "--instance", "p5.48xlarge"]) == options.EXIT_USAGE
    assert "--instance: 'p5.48xlarge' is not an instance the emulator knows" in capsys.readouterr().err
