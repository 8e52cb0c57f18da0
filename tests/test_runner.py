"""`neuron-lab run`: a notebook or `# %%` script headless in a real kernel, as a CI job runs it.

Each kernel test runs the real command (``neuron-lab run ...``, its console script's module; one runs it as
``python -m neuron_lab run``) on a tiny notebook or script
written here, and checks what a user or a CI job relies on: the progress and summary lines, the exit
code, and the --json/--output/--html files. Bad input never starts a kernel, so those cases call
``main`` in-process. Each kernel start costs seconds, so one run checks several things.

Tensors are made on the CPU and moved with ``.to(device)``: random creation on the device is an
``aten::normal_`` fallback of its own, and the counts asserted here are exact.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from html import unescape
from pathlib import Path

import nbformat
import pytest
from IPython.utils.capture import capture_output
from procs import Lines, default_sigint
from shells import loaded_shell
from shells import run as run_cell

from neuron_lab import agent
from neuron_lab.extension import session_of
from neuron_lab.report.model import Memory, Report
from neuron_lab.report.rows import INT64_NOTE
from neuron_lab.runner import execute, gates, kernel, main, options
from neuron_lab.runner.records import CellRecord

RUN_TIMEOUT = 300  # seconds for one whole `neuron-lab run`; the first torch.compile imports inductor
CONSOLE = Path(sys.executable).parent / "neuron-lab"

SETUP = "import torch\nx = torch.ones(64, 2).to(device)"
FALLBACK = "for _ in range(3):\n    y = torch.atan2(x, x + 1)\nprint('sum', y.sum().item())"  # line 2, 3 calls
BREAK = ("%%neuron compile\n"
         "class Net(torch.nn.Module):\n"
         "    def forward(self, t):\n"
         "        if t.sum() > 0:\n"  # line 4: a data-dependent branch is a graph break
         "            return t * 2\n"
         "        return t - 1\n"
         "out = Net()(torch.ones(4).to(device))")
READ = "noise = torch.randn(2, device=device)\nprint('mean', x.mean().item())"  # an aten::normal_ fallback; reads x


def notebook(path: Path, *cells: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_markdown_cell("# a tiny notebook")] + [nbformat.v4.new_code_cell(c) for c in cells]
    nbformat.write(nb, path)
    return path


def run(tmp: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``neuron-lab run ARGS`` in a new process, with a private IPython profile (no user startup files)."""
    env = {**os.environ, "IPYTHONDIR": str(tmp / "ipython"), **(env or {})}
    return subprocess.run([sys.executable, "-m", "_neuron_lab_cli", "run", *args], capture_output=True, text=True,
                          timeout=RUN_TIMEOUT, env=env, cwd=tmp)


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def summary_block(stdout: str) -> list[str]:
    """The run's summary block as the terminal printed it: from ``summary:`` up to the first ``wrote`` line."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("summary: "))
    end = next(i for i, line in enumerate(lines) if i > start and line.startswith("wrote "))
    return lines[start:end]


def html_summary_block(html: str) -> list[str]:
    """The summary block at the head of the ``--html`` page, as text."""
    found = re.search(r'<pre class="neuron-lab-run-summary">(.*?)</pre>', html, re.S)
    assert found, "no summary block in the HTML"
    return unescape(found.group(1)).splitlines()


def test_fallbacks_are_reported_per_cell_and_summed_and_exported(tmp_path):
    nb = notebook(tmp_path / "fb.ipynb", SETUP, FALLBACK, BREAK)
    out = tmp_path / "out" / "deeper"  # parent folders are created
    r = run(tmp_path, str(nb), "--backend", "emulator", "--coverage", "torchneuron-2.33", "--fail-on-fallback",
            "--allow-fallback", "atan2", "--max-peak-memory", "1GiB", "--json", str(out / "run.json"),
            "--output", str(out / "run.ipynb"), "--html", str(out / "run.html"))
    assert r.returncode == 0, r.stdout + r.stderr
    text = r.stdout
    assert "kernel ready · neuron_lab 0.1.0: emulator backend, coverage torchneuron-2.33 · device neuron:0" in text
    assert re.search(r"^\[1/3\] In\[1\] ok \S+ \S+$", text, re.M), text
    assert re.search(r"^\[2/3\] In\[2\] ok \S+ \S+ · 3 CPU fallback calls: aten::atan2\.out ×3 at In\[2\] line 2$",
                     text, re.M), text
    assert re.search(r"^\[3/3\] In\[3\] ok .* · 2 graphs, 1 graph break at In\[3\] line 4$", text, re.M), text
    # The cell's own report follows its line, as under the cell in Jupyter.
    assert "\n          at In[2] line 2: y = torch.atan2(x, x + 1)  (3×)\n" in text
    summary = text[text.index("summary: 3 of 3 cells ran"):]
    assert re.search(r"^    aten::atan2\.out +3× ", summary, re.M), summary
    assert "\n        at In[2] line 2: y = torch.atan2(x, x + 1)  (3×)\n" in summary
    assert "\n    graph break at In[3] line 4: if t.sum() > 0:\n" in summary
    assert re.search(r"^  peak device memory: \S+ \S+ of 24\.00 GiB \(<0\.1%\), in In\[\d\]$", summary, re.M)
    assert "\n  errors: none\n" in summary
    assert "  pass  --fail-on-fallback: only allowed CPU fallbacks; allowed: aten::atan2.out ×3\n" in summary
    assert "  pass  --max-peak-memory 1.00 GiB: the highest peak was " in summary
    assert text.rstrip().endswith("exit 0: every cell ran and every gate passed")

    doc = load(out / "run.json")
    assert (doc["schema"], doc["input"], doc["kind"], doc["exit_code"], doc["kernel_error"]) == (
        "neuron_lab.run/1", str(nb), "notebook", 0, None)
    assert doc["backend"]["backend"] == "emulator" and doc["backend"]["coverage"] == "torchneuron-2.33"
    assert doc["options"]["allow_fallback"] == ["atan2"] and doc["options"]["max_peak_memory"] == 2**30
    assert [(c["index"], c["label"], c["status"]) for c in doc["cells"]] == [
        (1, "In[1]", "ok"), (2, "In[2]", "ok"), (3, "In[3]", "ok")]
    row = doc["cells"][1]["report"]["ops_not_native"]
    assert [(o["op"], o["count"], [(s["site"]["cell"], s["site"]["line"], s["count"]) for s in o["sites"]])
            for o in row] == [("aten::atan2.out", 3, [(2, 2, 3)]), ("item", 1, [(2, 3, 1)])]  # the .item() a sync
    assert [(f["op"], f["count"], [(s["at"], s["count"]) for s in f["sites"]]) for f in doc["summary"]["syncs"]] \
        == [("item", 2, [("In[2] line 3", 1), ("In[3] line 4", 1)])]  # and the graph break's `if t.sum() > 0`
    assert doc["summary"]["sync_calls"] == 2
    assert [(f["op"], f["count"], [(s["at"], s["count"]) for s in f["sites"]]) for f in doc["summary"]["fallbacks"]] \
        == [("aten::atan2.out", 3, [("In[2] line 2", 3)])]
    assert doc["summary"]["compiles"]["breaks"] == 1 and doc["summary"]["errors"] == []
    assert [(g["gate"], g["passed"]) for g in doc["gates"]] == [
        ("--fail-on-fallback", True), ("--max-peak-memory 1.00 GiB", True)]

    executed = nbformat.read(out / "run.ipynb", as_version=4)
    nbformat.validate(executed)
    code = [c for c in executed.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == [1, 2, 3]
    outputs = code[1].outputs
    assert any(o.output_type == "stream" and o.text.startswith("sum ") for o in outputs)
    shown = [o for o in outputs if o.output_type == "display_data" and "neuron-lab-report" in o.data["text/html"]]
    assert len(shown) == 1 and "at In[2] line 2: y = torch.atan2(x, x + 1)  (3×)" in shown[0].data["text/plain"]
    html = (out / "run.html").read_text()
    assert "neuron-lab-report" in html and "aten::atan2.out" in html and "In[2] line 2" in html
    # the page opens with the summary block the terminal printed: cells ran, the run's report, the gates
    block = html_summary_block(html)
    assert block == summary_block(text) and block[0].startswith("summary: 3 of 3 cells ran in ")
    assert "  pass  --fail-on-fallback: only allowed CPU fallbacks; allowed: aten::atan2.out ×3" in block
    assert html.index('<pre class="neuron-lab-run-summary">') < html.index('<div class="jp-Cell jp-CodeCell')


def test_the_terminal_says_the_once_a_session_notes_jupyter_shows_under_the_cell(tmp_path):
    """The int64 note Jupyter shows under the first report with an int64 index follows that report in the terminal
    too, once a session, as under the cell."""
    nb = notebook(tmp_path / "ids.ipynb", "import torch\nemb = torch.nn.Embedding(100, 16).to(device)\n"
                                          "ids = torch.arange(32).view(4, 8).to(device)",
                  "emb(ids).sum().backward()", "emb(ids).sum().backward()")
    r = run(tmp_path, str(nb), "--output", "run.ipynb")
    assert r.returncode == 0, r.stdout + r.stderr
    cells = re.split(r"^(?=\[\d/3\] )", r.stdout, flags=re.M)[1:]
    assert [cell.count(INT64_NOTE) for cell in cells] == [0, 1, 0], r.stdout
    assert cells[1].rstrip().endswith("\n    " + INT64_NOTE)  # below the report, indented as it is
    executed = [c for c in nbformat.read(tmp_path / "run.ipynb", as_version=4).cells if c.cell_type == "code"]
    assert [[o.data["text/plain"] for o in c.outputs if o.output_type == "display_data"].count(INT64_NOTE)
            for c in executed] == [0, 1, 0]


def test_a_notebook_that_loads_neuron_lab_itself_sets_its_environment_first(tmp_path):
    # Nothing of neuron_lab (not even torch) is imported before the notebook's own %load_ext: the %env
    # before it still decides the emulated capacity, as in Jupyter.
    nb = notebook(tmp_path / "own.ipynb", "%env NEURON_LAB_DEVICE_MEMORY=1MiB", "%load_ext neuron_lab",
                  "import torch\n" + SETUP + "\ny = torch.atan2(x, x)")
    r = run(tmp_path, str(nb), "--json", "run.json")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[1].startswith("kernel ready · the notebook loads neuron_lab itself (%load_ext neuron_lab)")
    at = lines.index(next(x for x in lines if x.startswith("neuron_lab loaded by the notebook · ")))
    assert lines[at - 1].startswith("[2/3] In[2] ok ") and "· 1.00 MiB ·" in lines[at]
    assert re.search(r"^\[3/3\] In\[3\] ok .* · 1 CPU fallback call: aten::atan2.out ×1 at In\[3\] line 4$",
                     r.stdout, re.M), r.stdout
    doc = load(tmp_path / "run.json")
    assert "1.00 MiB" in doc["backend"]["banner"] and doc["backend"]["by_notebook"] is True
    assert [c["report"] is not None for c in doc["cells"]] == [False, False, True]
    assert doc["summary"]["peak_memory"]["capacity"] == 2**20


def test_one_more_op_or_site_is_said_in_the_singular(tmp_path):
    """Four ops, one of them at four lines: the cell's line names three ops and "1 more op", its report three lines
    of that op and "1 more site"."""
    nb = notebook(tmp_path / "more.ipynb", "import torch\nx = torch.ones(8, 3).to(device)",
                  "for k in range(4):\n    b = torch.linalg.cross(x + k, x)\n"
                  "b = torch.linalg.cross(x + 5, x)\nb = torch.linalg.cross(x + 6, x)\n"
                  "b = torch.linalg.cross(x + 7, x)\na = torch.atan2(x, x)\nc = torch.empty(8).to(device).normal_()\n"
                  "d = torch.zeros(8, 3).to(device).scatter_reduce(0, torch.zeros(8, 3, dtype=torch.long).to(device), "
                  "x, 'sum')")
    r = run(tmp_path, str(nb))
    assert r.returncode == options.EXIT_OK, r.stdout + r.stderr
    # the ops come slowest first, an order of measured times: the facts are the four-line op's and the count
    (line,) = [x for x in r.stdout.splitlines() if x.startswith("[2/2] In[2] ok ")]
    assert " · 10 CPU fallback calls: " in line and line.endswith(", 1 more op"), line
    assert "aten::linalg_cross.out ×7 at In[2] line 2 (4×), 3 more sites, " in line or "linalg_cross" not in line, line
    assert re.search(r"^ +… 1 more site$", r.stdout, re.M), r.stdout


def test_each_failing_gate_exits_3_and_says_why(tmp_path):
    nb = notebook(tmp_path / "fb.ipynb", SETUP, FALLBACK, BREAK, READ)
    # Options before and after PATH.
    r = run(tmp_path, "--fail-on-fallback", str(nb), "--max-peak-memory", "1KiB", "--fail-on-graph-break",
            "--allow-fallback", "atan", "--json", "run.json", "--html", "run.html")
    assert r.returncode == options.EXIT_GATE, r.stdout + r.stderr
    text = r.stdout
    ops = ("aten::atan2.out ×3 at In[2] line 2", "aten::normal_ ×1 at In[4] line 1")  # ordered by host time
    assert any(f"  FAIL  --fail-on-fallback: 2 ops ran on the CPU (4 calls): {a}; {b} (exempt one with "
               "--allow-fallback OP); --allow-fallback atan matched no fallback\n" in text for a, b in (ops, ops[::-1]))
    # In[2] and In[3] took the device over 1 KiB; In[4] started above it (x, y and out) and only read it.
    assert re.search(r"^  FAIL  --max-peak-memory 1\.00 KiB: 2 cells took it above the limit: "
                     r"In\[2\] 512 B → \S+ KiB, In\[3\] \S+ \S+ → \S+ KiB; "
                     r"1 cell started above it \(not blamed\): In\[4\] \S+ KiB at its start$", text, re.M), text
    assert "  FAIL  --fail-on-graph-break: 1 graph break: In[3] line 4: if t.sum() > 0: (" in text  # then the reason
    assert text.rstrip().endswith("exit 3: a gate failed: --fail-on-fallback, --max-peak-memory, --fail-on-graph-break")
    doc = load(tmp_path / "run.json")
    assert doc["exit_code"] == 3 and [g["passed"] for g in doc["gates"]] == [False, False, False]
    assert [(g["limit"], g["blamed"]) for g in doc["gates"]] == [
        ("no CPU fallbacks except atan", ["In[2]", "In[4]"]), ("1.00 KiB", ["In[2]", "In[3]"]),
        ("no graph breaks", ["In[3]"])]
    assert [g["measured"].split(" in ")[0] for g in doc["gates"]][::2] == ["4 calls of 2 ops not allowed",
                                                                        "1 graph break"]
    assert (doc["summary"]["ran"], doc["summary"]["failures"], doc["summary"]["fallback_calls"]) == (4, 0, 4)

    # The HTML export leads with the run summary and one verdict row per gate, before the first cell.
    html = (tmp_path / "run.html").read_text()
    start = html.index('<section class="neuron-lab-run">')
    head = html[start:html.index("</section>", start)]
    assert start < html.index('<div class="jp-Cell jp-CodeCell')
    assert "<p>exit 3: a gate failed: --fail-on-fallback, --max-peak-memory, --fail-on-graph-break</p>" in head
    block = html_summary_block(head)
    assert block == summary_block(text)  # the terminal's lines, every gate's FAIL line among them
    assert block[0].startswith("summary: 4 of 4 cells ran in ") and "  errors: none" in block
    assert [line for line in block if line.startswith("  FAIL  ")] == [f"  {gates.GateResult(**g).line}"
                                                                        for g in doc["gates"]]
    assert re.search(r"^  peak device memory: \S+ KiB of 24\.00 GiB \(<0\.1%\), in In\[\d\]$", "\n".join(block),
                     re.M)
    rows = re.findall(r'<tr class="neuron-lab-gate">(.*?)</tr>', head)
    assert [re.findall(r"<td>(.*?)</td>", row) for row in rows] == [
        ["--fail-on-fallback", '<span class="fail">FAIL</span>', "no CPU fallbacks except atan",
         "4 calls of 2 ops not allowed", "In[2], In[4]"],
        ["--max-peak-memory 1.00 KiB", '<span class="fail">FAIL</span>', "1.00 KiB", doc["gates"][1]["measured"],
         "In[2], In[3]"],
        ["--fail-on-graph-break", '<span class="fail">FAIL</span>', "no graph breaks", "1 graph break", "In[3]"]]

    # Each gate decides alone, on this run's own reports: the same evaluation the command made.
    cells = [CellRecord(c["index"], c["number"], c["status"], report=c["report"]) for c in doc["cells"]]
    reports = [Report.from_dict(c.report) for c in cells]

    def code(*argv: str) -> int:
        args = main.parser().parse_args([str(nb), *argv])
        return main.exit_code(execute.Outcome(cells), gates.evaluate(reports, args))

    assert code() == 0
    assert code("--fail-on-fallback") == 3
    allow = ("--fail-on-fallback", "--allow-fallback", "aten::atan2", "--allow-fallback")
    assert code(*allow, "normal") == 0  # a base name covers the in-place aten::normal_ the report lists
    allowed = gates.fallback_gate(reports, ["atan2", "normal"])
    said, _, listed = allowed.why.partition("; allowed: ")
    assert (said, sorted(listed.split(", ")), allowed.measured, allowed.blamed) == (
        "only allowed CPU fallbacks", ["aten::atan2.out ×3", "aten::normal_ ×1"], "4 allowed calls, no other", [])
    assert code(*allow, "aten::normal_") == 0
    assert code(*allow, "aten::normal.out") == 3  # one other overload only
    assert code("--fail-on-fallback", "--allow-fallback", "aten::atan2.out", "--allow-fallback", "normal") == 0
    assert code("--fail-on-fallback", "--allow-fallback", "atan2.default", "--allow-fallback", "normal") == 3
    assert code("--max-peak-memory", "1KiB") == 3
    assert code("--max-peak-memory", "1GiB") == 0
    assert code("--fail-on-graph-break") == 3
    # the last line names the gates that failed, not every gate there is
    one = [gates.GateResult("--max-peak-memory 1.00 KiB", False, "1 cell peaked above it"),
           gates.GateResult("--fail-on-fallback", True, "no CPU fallbacks")]
    assert main._why(3, 3, one) == "a gate failed: --max-peak-memory"


def test_a_cell_that_raises_stops_the_run_and_outranks_gates(tmp_path):
    nb = notebook(tmp_path / "err.ipynb", SETUP + "\ny = torch.atan2(x, x)", "raise ValueError('boom')",
                  "print('after')")
    allowed = nbformat.v4.new_code_cell("raise KeyError('expected')", metadata={"tags": ["raises-exception"]})
    book = nbformat.read(nb, as_version=4)
    book.cells.insert(2, allowed)  # a cell that may raise: the run goes on, and says it raised
    nbformat.write(book, nb)
    r = run(tmp_path, str(nb), "--fail-on-fallback", "--json", "run.json")
    assert r.returncode == options.EXIT_CELL_ERROR, r.stdout + r.stderr
    text = r.stdout
    assert re.search(r"^\[2/4\] In\[2\] ok \S+ \S+ · raised KeyError: 'expected' \(tagged raises-exception: the run "
                     r"goes on\)$", text, re.M), text
    assert re.search(r"^\[3/4\] In\[3\] error \S+ \S+ · ValueError: boom$", text, re.M), text
    assert "----> 1 raise ValueError('boom')" in text  # the traceback, under the cell's line
    assert not re.search(r"^\[4/4\]", text, re.M) and "after" not in text
    assert "\n  error in In[3] [3/4]: ValueError: boom\n" in text
    assert "\n  not run: 1 cell ([4/4])\n" in text
    assert "  FAIL  --fail-on-fallback: 1 op ran on the CPU (1 call): aten::atan2.out ×1 at In[1] line 3" in text
    doc = load(tmp_path / "run.json")
    assert [c["status"] for c in doc["cells"]] == ["ok", "ok", "error", "not run"]
    assert doc["cells"][1]["error"]["ename"] == "KeyError"
    assert doc["summary"]["errors"] == [{"cell": "In[3]", "number": 3, "status": "error", "ename": "ValueError",
                                         "evalue": "boom"}]
    assert doc["exit_code"] == 1 and doc["gates"][0]["passed"] is False


def test_a_tagged_usage_error_is_said_raised_as_other_tagged_errors_are(tmp_path):
    """IPython prints a magic's UsageError instead of showing a traceback: the cell has no error output, yet it
    raised."""
    nb = notebook(tmp_path / "usage.ipynb", "print('after')")
    book = nbformat.read(nb, as_version=4)
    book.cells.insert(1, nbformat.v4.new_code_cell("%%neuron ranks\nx = 1", metadata={"tags": ["raises-exception"]}))
    nbformat.write(book, nb)
    r = run(tmp_path, str(nb), "--json", "run.json")
    assert r.returncode == options.EXIT_OK, r.stdout + r.stderr
    assert re.search(r"^\[1/2\] In\[1\] ok \S+ \S+ · raised UsageError: %%neuron ranks: no ranks are running; .* "
                     r"\(tagged raises-exception: the run goes on\)$", r.stdout, re.M), r.stdout
    assert load(tmp_path / "run.json")["cells"][0]["error"]["ename"] == "UsageError"


def test_a_dead_kernel_exits_4_and_keeps_the_reports_so_far(tmp_path):
    nb = notebook(tmp_path / "die.ipynb", SETUP + "\ny = torch.atan2(x, x)", "import os; os._exit(1)", "print(1)")
    out = tmp_path / "out"
    r = run(tmp_path, str(nb), "--json", str(out / "run.json"), "--output", str(out / "run.ipynb"),
            "--html", str(out / "run.html"))
    assert r.returncode == options.EXIT_KERNEL, r.stdout + r.stderr
    assert re.search(r"^\[2/3\] In\[2\] kernel died ", r.stdout, re.M), r.stdout
    assert "kernel failed: the kernel died while running cell [2/3]" in r.stdout
    assert "\n  error in In[2] [2/3]: kernel died: the kernel process ended while the cell ran\n" in r.stdout
    doc = load(out / "run.json")
    assert doc["exit_code"] == 4 and doc["kernel_error"] == "the kernel died while running cell [2/3]"
    assert [c["status"] for c in doc["cells"]] == ["ok", "kernel died", "not run"]
    rows = doc["cells"][0]["report"]["ops_not_native"]
    assert [(o["op"], o["count"], o["sites"][0]["site"]["line"]) for o in rows] == [("aten::atan2.out", 1, 3)]
    assert doc["summary"]["fallback_calls"] == 1 and doc["summary"]["errors"][0]["ename"] == "kernel died"
    executed = nbformat.read(out / "run.ipynb", as_version=4)
    assert executed.cells[1].outputs and not executed.cells[2].outputs
    html = (out / "run.html").read_text()
    assert "aten::atan2.out" in html
    block = html_summary_block(html)  # the dead kernel is in the page's summary block, as on the terminal
    assert block == summary_block(r.stdout) and "kernel failed: the kernel died while running cell [2/3]" in block


def test_ctrl_c_stops_at_the_running_cell_exits_130_and_keeps_its_report(tmp_path):
    nb = notebook(tmp_path / "slow.ipynb", SETUP + "\ny = torch.atan2(x, x)",
                  "y = torch.atan2(x, x)\nimport time\nfor _ in range(600):\n    time.sleep(0.1)", "print('never')")
    env = {**os.environ, "IPYTHONDIR": str(tmp_path / "ipython")}
    proc = subprocess.Popen([sys.executable, "-m", "_neuron_lab_cli", "run", str(nb), "--json", "run.json"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_sigint)
    out, errs = Lines(proc.stdout), Lines(proc.stderr)
    seen = []
    try:
        while line := out.next(RUN_TIMEOUT, "the runner's '[1/3]' line"):  # Ctrl-C once cell 2 is sleeping
            seen.append(line)
            if line.startswith("[1/3]"):
                time.sleep(2)
                proc.send_signal(signal.SIGINT)
                break
        rest = out.rest(RUN_TIMEOUT, "the runner's output after Ctrl-C, to its end")
        proc.wait(timeout=RUN_TIMEOUT)
        err = errs.rest(10, "the runner's stderr")
    finally:
        proc.kill()
    text = "".join(seen) + rest
    assert proc.returncode == options.EXIT_INTERRUPTED, text + err
    assert "interrupted: stopping at the running cell" in text
    assert re.search(r"^\[2/3\] In\[2\] interrupted \S+ \S+ · 1 CPU fallback call: aten::atan2.out ×1 at "
                     r"In\[2\] line 1 · KeyboardInterrupt", text, re.M), text
    assert not re.search(r"^\[3/3\]", text, re.M) and text.rstrip().endswith("exit 130: " + options.MEANINGS[130])
    doc = load(tmp_path / "run.json")
    assert [c["status"] for c in doc["cells"]] == ["ok", "interrupted", "not run"]
    assert doc["cells"][1]["report"]["ops_not_native"][0]["count"] == 1  # the interrupted cell's report came back
    assert doc["exit_code"] == 130 and doc["kernel_error"] is None


def test_a_kernel_that_cannot_start_exits_4_with_its_stderr(tmp_path):
    spec = tmp_path / "jupyter" / "kernels" / "python3"  # JUPYTER_PATH comes before the built-in python3 kernel
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-c", "import sys; sys.exit('no kernel here')", "{connection_file}"],
        "display_name": "broken", "language": "python"}))
    nb = notebook(tmp_path / "nb.ipynb", "print(1)")
    r = run(tmp_path, str(nb), "--json", "run.json", env={"JUPYTER_PATH": str(tmp_path / "jupyter")})
    assert r.returncode == options.EXIT_KERNEL, r.stdout + r.stderr
    assert "kernel failed: the kernel did not start: " in r.stdout and "    no kernel here" in r.stdout
    assert "Traceback" not in r.stderr
    doc = load(tmp_path / "run.json")
    assert doc["kernel_error"].startswith("the kernel did not start") and "no kernel here" in doc["kernel_stderr"]
    assert [c["status"] for c in doc["cells"]] == ["not run"]


def test_a_script_reports_file_lines_and_a_timeout_stops_it(tmp_path):
    script = tmp_path / "script.py"
    script.write_text('"""A training script."""\n'   # 1
                      "import torch\n"                # 2
                      "\n"                            # 3
                      "# %% move\n"                   # 4
                      "x = torch.ones(8).to(device)\n"  # 5
                      "\n"                            # 6
                      "# %% fallback\n"               # 7
                      "z = x * 2\n"                   # 8
                      "y = torch.atan2(z, x)\n"       # 9
                      "# %%\n"                        # 10
                      "import time\n"                 # 11
                      "time.sleep(60)\n"              # 12
                      "# %%\n"                        # 13
                      "print('after')\n")             # 14
    r = run(tmp_path, "script.py", "--timeout", "6", "--json", "run.json")
    assert r.returncode == options.EXIT_CELL_ERROR, r.stdout + r.stderr
    text = r.stdout
    assert "neuron-lab run script.py (script, 5 code cells): starting a kernel" in text
    assert re.search(r"^\[3/5\] script\.py:7 ok \S+ \S+ · 1 CPU fallback call: aten::atan2\.out ×1 at script\.py:9$",
                     text, re.M), text
    assert "at script.py:9: y = torch.atan2(z, x)  (1×)" in text
    assert re.search(r"^\[4/5\] script\.py:10 timeout .* · CellTimeoutError: the cell ran past --timeout 6 s$",
                     text, re.M), text
    assert "\n  error in script.py:10 [4/5]: CellTimeoutError: the cell ran past --timeout 6 s\n" in text
    assert "after" not in text
    doc = load(tmp_path / "run.json")
    assert doc["kind"] == "script" and doc["exit_code"] == 1
    assert [(s["at"], s["line"]) for s in doc["summary"]["fallbacks"][0]["sites"]] == [("script.py:9", 9)]
    assert doc["cells"][3]["status"] == "timeout"
    assert doc["cells"][3]["report"]["error"].startswith("KeyboardInterrupt")  # the interrupted cell still reports


def test_a_scripts_tracebacks_and_lines_are_the_script_files(tmp_path):
    """IPython compiles each chunk at its lines in the script: a traceback names the script and its lines (not
    ``Cell In[3], line 2``), and so does a fallback in a function an earlier chunk defined (not ``In[1] line 3``)."""
    script = tmp_path / "script.py"
    script.write_text("import torch\n"                   # 1
                      "def f(t):\n"                      # 2
                      "    return torch.atan2(t, t)\n"   # 3
                      "x = torch.ones(2).to(device)\n"   # 4
                      "# %%\n"                           # 5
                      "y = f(x)\n"                       # 6
                      "def g(v):\n"                      # 7
                      "    raise ValueError(f'bad {v}')\n"  # 8
                      "# %%\n"                           # 9
                      "g(3)\n")                          # 10
    r = run(tmp_path, "script.py", "--output", "out.ipynb")
    assert r.returncode == options.EXIT_CELL_ERROR, r.stdout + r.stderr
    text = r.stdout
    assert re.search(r"^\[2/3\] script\.py:5 ok \S+ \S+ · 1 CPU fallback call: aten::atan2\.out ×1 at script\.py:3$",
                     text, re.M), text
    traceback = text[text.index("[3/3] script.py:9 error"):text.index("summary: ")]
    assert "Cell In[" not in traceback, traceback
    assert re.search(r"^    File script\.py, line 10$\n(.*\n)*^    -+> 10 g\(3\)$", traceback, re.M), traceback
    assert re.search(r"^    File script\.py, line 8, in g\(v\)$\n(.*\n)*^    -+> 8 +raise ValueError", traceback, re.M)
    (error,) = [o for o in nbformat.read(tmp_path / "out.ipynb", 4).cells[2].outputs if o.output_type == "error"]
    assert "File script.py, line 10" in re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(error.traceback))  # the notebook's too


def test_in_the_kernel_a_scripts_lines_are_a_site_map_and_the_reports_a_collector_on_the_session(tmp_path):
    """The runner's kernel side keeps one Collector on the session, found again after each cell; the script's
    lines are applied before any listener runs, so the report the extension shows already says FILE:LINE."""
    script = {"path": "train.py", "file": str(tmp_path / "train.py"), "first_lines": [1, 10, 20]}
    with loaded_shell(instance=True) as sh:
        sh.run_line_magic("config", "NeuronLab.report_detail = 'full'")
        info = kernel.install(sh, script).data
        assert info["backend"] == "emulator" and sh.user_ns["__file__"] == script["file"]
        session = session_of(sh)
        collector = agent.Collector.of(session)
        assert collector is not None and session.listeners[-1] == collector.keep  # appended, after the display
        run_cell(sh, "import torch\nx = torch.ones(4).to(device)")
        _, shown = run_cell(sh, "def f(t):\n    return torch.atan2(t, t)\ny = f(x)")
        assert "train.py:11" in shown.outputs[-1].data["text/plain"]  # In[2] line 2 is the script's line 11
        after = agent.after_cell(sh, script).data
        assert after["loaded"] is None and agent.Collector.of(session) is collector
        assert [r["report"]["title"] for r in after["reports"]] == ["train.py:1", "train.py:10"]
        (row,) = after["reports"][1]["report"]["ops_not_native"]
        (site,) = row["sites"]
        assert (site["site"]["filename"], site["site"]["line"], site["site"]["cell"]) == ("train.py", 11, None)
        assert any(frame.startswith("train.py:12") for stack in site["stacks"] for frame in stack), site["stacks"]
        assert agent.after_cell(sh, script).data["reports"] == []  # handed over once

        with capture_output():
            sh.run_line_magic("reload_ext", "neuron_lab")  # a new session: the next call attaches to it
        again = agent.after_cell(sh, script).data
        assert again["loaded"]["backend"] == "emulator" and again["reports"] == []
        run_cell(sh, "z = torch.atan2(x, x)")
        (report,) = agent.after_cell(sh, script).data["reports"]
        assert report["report"]["title"] == "train.py:20"


def _bad(tmp_path: Path, name: str) -> Path:
    p = tmp_path / name
    contents = {"notes.txt": "hello", "bad.ipynb": "{not json", "nocells.ipynb": json.dumps({"metadata": {}})}
    if name in contents:
        p.write_text(contents[name])
    return p


@pytest.mark.parametrize(("name", "extra", "message"), [
    ("missing.ipynb", [], "neuron-lab run: {path}: no such file"),
    ("notes.txt", [], "neuron-lab run: {path}: not a notebook (.ipynb) or a Python script (.py)"),
    ("bad.ipynb", [], "neuron-lab run: {path}: not a notebook: invalid JSON at line 1 column 2: "
                      "Expecting property name enclosed in double quotes"),
    ("nocells.ipynb", [], "neuron-lab run: {path}: not a notebook: the JSON has no 'cells'"),
])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, capsys, name, extra, message):
    path = _bad(tmp_path, name)
    assert main.main([str(path), *extra, "--json", str(tmp_path / "run.json")]) == options.EXIT_USAGE
    err = capsys.readouterr().err
    assert err == message.format(path=path) + "\n"
    assert not (tmp_path / "run.json").exists()


def test_a_profile_that_cannot_load_is_bad_input(tmp_path, capsys):
    nb = notebook(tmp_path / "nb.ipynb", "print(1)")
    assert main.main([str(nb), "--coverage", "no-such-coverage"]) == options.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("neuron-lab run: --coverage: no coverage 'no-such-coverage'") and err.count("\n") == 1


@pytest.mark.parametrize(("extra", "message"), [
    (["--engines", "ssh"], "ssh engines need their hosts: `--engines ssh --ssh-hosts node1,node2`"),
    (["--ssh-hosts", "node1"], "--ssh-hosts goes with --engines ssh"),
    (["--engines", "ssh", "--ssh-hosts", "node1,node1"], "--ssh-hosts: 'node1,node1' names a host twice; give each "
                                                         "host once"),
])
def test_ssh_engines_for_a_notebooks_ranks_need_their_hosts(tmp_path, capsys, extra, message):
    nb = notebook(tmp_path / "nb.ipynb", "print(1)")
    assert main.main([str(nb), *extra]) == options.EXIT_USAGE
    assert capsys.readouterr().err == f"neuron-lab run: {message}\n"


def test_ssh_engines_and_their_hosts_reach_the_kernel():
    args = main.parser().parse_args(["nb.ipynb", "--engines", "ssh", "--ssh-hosts", "node1,user@node2:2222"])
    env = main.kernel_env(args)
    assert (env["NEURON_LAB_RANKS_ENGINES"], env["NEURON_LAB_RANKS_SSH_HOSTS"]) == ("ssh", "node1,user@node2:2222")


@pytest.mark.parametrize(("contents", "message"), [
    (b"\x89PNG\r\n\x1a\n\xff", "not a JSON text file (byte 0x89 at offset 0 is not UTF-8)"),
    (b"[" * 100_000 + b"]" * 100_000, "invalid coverage: its JSON is nested too deeply"),
    (json.dumps({"schema_version": 1, "name": "x", "source": "s", "date": "d", "ops": [1]}).encode(),
     "ops: expected an object mapping op names (such as \"aten::add\") to rules, got a list"),
])
def test_a_broken_profile_file_is_a_one_line_usage_error(tmp_path, capsys, contents, message):
    nb = notebook(tmp_path / "nb.ipynb", "print(1)")
    profile = tmp_path / "profile.json"
    profile.write_bytes(contents)
    assert main.main([str(nb), "--coverage", str(profile), "--json", str(tmp_path / "run.json")]) == options.EXIT_USAGE
    assert capsys.readouterr().err == f"neuron-lab run: --coverage: {profile}: {message}\n"
    assert not (tmp_path / "run.json").exists()


def test_the_console_script_refuses_bad_numbers_and_profiles_with_exit_2_and_no_traceback(tmp_path):
    nb = notebook(tmp_path / "nb.ipynb", "print(1)")
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe")
    for args in (["--timeout", "nan"], ["--timeout", "inf"], ["--max-peak-memory", "1e999"],
                 ["--coverage", str(tmp_path / "bin.json")]):
        r = subprocess.run([str(CONSOLE), "run", str(nb), *args], capture_output=True, text=True, timeout=120)
        assert r.returncode == options.EXIT_USAGE, (args, r.stderr)
        assert "Traceback" not in r.stderr and r.stdout == "", (args, r.stderr)
        last = r.stderr.splitlines()[-1]
        assert last.startswith(("neuron-lab run: error: argument", "neuron-lab run: --coverage: ")), (args, last)


@pytest.mark.parametrize(("argv", "message"), [
    (["{nb}", "--bogus"], "neuron-lab run: error: unrecognized arguments: --bogus"),
    (["{nb}", "--fail-on-fallbak"],
     "neuron-lab run: error: unrecognized arguments: --fail-on-fallbak (did you mean --fail-on-fallback?)"),
    (["{nb}", "--max-peak-memory", "lots"],
     "neuron-lab run: error: argument --max-peak-memory: cannot read 'lots' as a size (examples: 512MiB, 2GiB, "
     "1048576)"),
    (["{nb}", "--timeout", "0"], "neuron-lab run: error: argument --timeout: '0' is not a positive number of seconds "
                                 "(at most 1e+06)"),
    (["{nb}", "--timeout", "nan"], "neuron-lab run: error: argument --timeout: 'nan' is not a positive number of "
                                   "seconds (at most 1e+06)"),
    (["{nb}", "--timeout", "inf"], "neuron-lab run: error: argument --timeout: 'inf' is not a positive number of "
                                   "seconds (at most 1e+06)"),
    (["{nb}", "--timeout", "1e999"], "neuron-lab run: error: argument --timeout: '1e999' is not a positive number of "
                                     "seconds (at most 1e+06)"),
    (["{nb}", "--timeout", "-5"], "neuron-lab run: error: argument --timeout: '-5' is not a positive number of "
                                  "seconds (at most 1e+06)"),
    (["{nb}", "--max-peak-memory", "1e999"],
     "neuron-lab run: error: argument --max-peak-memory: cannot read '1e999' as a size (examples: 512MiB, 2GiB, "
     "1048576)"),
    (["{nb}", "--max-peak-memory", "infGiB"],
     "neuron-lab run: error: argument --max-peak-memory: cannot read 'infGiB' as a size (examples: 512MiB, 2GiB, "
     "1048576)"),
    (["{nb}", "--max-peak-memory", "nan"],
     "neuron-lab run: error: argument --max-peak-memory: cannot read 'nan' as a size (examples: 512MiB, 2GiB, "
     "1048576)"),
])
def test_bad_options_exit_2_through_argparse(tmp_path, capsys, argv, message):
    nb = notebook(tmp_path / "nb.ipynb", "print(1)")
    with pytest.raises(SystemExit) as e:
        main.main([a.format(nb=nb) for a in argv])
    assert e.value.code == options.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == message and "Traceback" not in err


def test_the_console_script_documents_exit_codes_and_rejects_unknown_options(tmp_path):
    assert CONSOLE.exists(), "the neuron-lab console script is not installed in this venv"
    help_ = subprocess.run([str(CONSOLE), "run", "--help"], capture_output=True, text=True, timeout=120)
    assert help_.returncode == 0
    for code, meaning in options.MEANINGS.items():
        assert f"\n  {code}  {meaning}\n" in help_.stdout
    nb = notebook(tmp_path / "nb.ipynb", "print(1)")
    bad = subprocess.run([str(CONSOLE), "run", str(nb), "--bogus"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert bad.stderr.splitlines()[-1] == "neuron-lab run: error: unrecognized arguments: --bogus"
    assert bad.stderr.startswith("usage: neuron-lab run ")  # the command's usage, not the top parser's


def test_allow_fallback_spellings():
    """``--allow-fallback`` names an op by its base name (every overload, in-place form included), by its in-place
    name (in-place forms only), or by one overload (``aten::x`` and ``aten::x.default`` are the same one)."""
    covered = {spec: [op for op in ("aten::normal", "aten::normal_", "aten::normal.Tensor_float", "aten::normal.out",
                                    "aten::normal_.default", "aten::normalize", "aten::atan2.out", "prims::normal")
                      if options.op_matches(spec, op)]
               for spec in ("normal", "aten::normal", "normal_", "aten::normal.out", "normal.default", "atan2",
                            "atan")}
    assert covered == {
        "normal": ["aten::normal", "aten::normal_", "aten::normal.Tensor_float", "aten::normal.out",
                   "aten::normal_.default"],
        "aten::normal": ["aten::normal", "aten::normal_", "aten::normal.Tensor_float", "aten::normal.out",
                         "aten::normal_.default"],
        "normal_": ["aten::normal_", "aten::normal_.default"],
        "aten::normal.out": ["aten::normal.out"],
        "normal.default": ["aten::normal"],
        "atan2": ["aten::atan2.out"],
        "atan": [],
    }


def test_the_memory_gate_blames_the_cells_that_took_memory_over_the_limit():
    """Blamed: a cell that started within the limit and peaked above it. Not blamed: a cell that only ran
    while earlier cells' tensors held the memory above it, even if it allocated a little more."""
    def cell(n: int, before: int, peak: int) -> Report:
        return Report(f"In[{n}]", n, "neuron:0", "default", "emulator", memory=Memory(before, peak, peak, 2**30))

    mib = 2**20
    reports = [cell(1, 0, 10 * mib), cell(2, 10 * mib, 90 * mib), cell(3, 90 * mib, 91 * mib),
               cell(6, 91 * mib, 91 * mib),  # touched nothing (`%neuron mode eager`): not named
               cell(4, 40 * mib, 120 * mib), cell(5, 20 * mib, 30 * mib)]
    g = gates.memory_gate(reports, 64 * mib)
    assert (g.passed, g.limit, g.measured, g.blamed) == (False, "64.00 MiB", "120.00 MiB in In[4]", ["In[2]", "In[4]"])
    assert g.why == ("2 cells took it above the limit: In[2] 10.00 MiB → 90.00 MiB, In[4] 40.00 MiB → 120.00 MiB; "
                     "1 cell started above it (not blamed): In[3] 90.00 MiB at its start")
    ok = gates.memory_gate(reports, 128 * mib)
    assert (ok.passed, ok.why, ok.blamed) == (True, "the highest peak was 120.00 MiB", [])


def test_allow_fallback_without_the_fallback_gate_says_it_has_no_effect(tmp_path):
    nb = notebook(tmp_path / "one.ipynb", "print(1)")
    r = run(tmp_path, str(nb), "--allow-fallback", "atan2")
    assert r.returncode == options.EXIT_OK, r.stdout + r.stderr
    assert "neuron-lab run: --allow-fallback has no effect without --fail-on-fallback\n" in r.stderr, r.stderr
    quiet = run(tmp_path, str(nb), "--allow-fallback", "atan2", "--fail-on-fallback")
    assert quiet.returncode == options.EXIT_OK and "--allow-fallback" not in quiet.stderr, quiet.stderr


def test_a_reader_that_leaves_early_is_no_traceback_and_the_files_still_come(tmp_path):
    nb = notebook(tmp_path / "one.ipynb", "print(1)", "print(2)")
    env = {**os.environ, "IPYTHONDIR": str(tmp_path / "ipython")}
    r = subprocess.run(f"{shlex.quote(sys.executable)} -m neuron_lab run {nb} --json run.json | head -1", shell=True,
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert r.stdout.startswith("neuron-lab run ") and r.stdout.count("\n") == 1
    assert "Traceback" not in r.stderr and "BrokenPipeError" not in r.stderr, r.stderr
    assert load(tmp_path / "run.json")["exit_code"] == 0


def test_a_long_first_compile_prints_each_step_once_and_leaves_no_progress_output(tmp_path):
    """Headless, the cell's progress line is plain lines on the terminal, one per step, before the cell's own line
    (no carriage returns, no dynamo names); the executed notebook keeps none of it."""
    path = notebook(tmp_path / "nb.ipynb", "%config NeuronLab.compile_progress_s = 0\n" + SETUP, BREAK)
    r = run(tmp_path, "nb.ipynb", "--output", "out.ipynb")
    assert r.returncode == options.EXIT_OK, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    steps = [x for x in lines if x.startswith("[2/2] In[2] … ")]
    assert steps[0] == "[2/2] In[2] … loading PyTorch's compiler (once a session)", lines
    assert len(steps) == len(set(steps)) and "\r" not in r.stdout and "dynamo" not in " ".join(steps), steps
    done = next(i for i, x in enumerate(lines) if x.startswith("[2/2] In[2] ok "))
    assert max(lines.index(x) for x in steps) < done
    out = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    assert not [o for c in out.cells if c.cell_type == "code" for o in c.outputs
                if "application/vnd.neuron-lab.progress+json" in o.get("data", {})]
    assert path.exists()


def test_the_abort_gate_fails_a_notebook_that_interpolates_a_parameter_bicubically(tmp_path):
    """An op a public report saw abort the process on TorchNeuron, on a parameter: the cell's report has the
    error-level row with the report's URL, the run warns (NEURON_LAB_ABORTS=warn, the default) and
    ``--fail-on-abort`` exits 3 naming the op and line."""
    nb = notebook(tmp_path / "nb.ipynb", "import torch, torch.nn.functional as F\n"
                  "w = torch.nn.Parameter(torch.randn(1, 1, 4, 4).to(device))",
                  "y = F.interpolate(w, scale_factor=2, mode='bicubic')")
    r = run(tmp_path, str(nb), "--backend", "emulator", "--fail-on-abort", env={"NEURON_LAB_ABORTS": ""})
    assert r.returncode == 3, r.stdout + r.stderr
    assert "error: may abort the process on TorchNeuron (1 op, 1 call" in r.stdout, r.stdout
    assert "https://github.com/huggingface/optimum-neuron/pull/1119" in r.stdout
    (line,) = [x for x in r.stdout.splitlines() if x.startswith("  FAIL  --fail-on-abort: ")]
    assert line.startswith("  FAIL  --fail-on-abort: 1 possible abort of 1 op: aten::upsample_bicubic2d"), line
    assert "at In[2] line 1" in line, line
    assert r.stdout.rstrip().endswith("exit 3: a gate failed: --fail-on-abort"), r.stdout[-500:]


def test_a_progress_line_says_an_errors_first_line_and_the_traceback_the_rest():
    """Dynamo's fullgraph error (and argparse's usage) runs over many lines: the progress line says the first, a
    tagged cell's line ends with its note, and a failed cell's traceback below says the whole."""
    from neuron_lab.runner import progress
    from neuron_lab.runner.records import ERROR, OK, CellRecord

    message = "Data-dependent branching\n  Explanation: Detected data-dependent branching.\n\n  Hint: Use torch.cond."
    error = {"ename": "Unsupported", "evalue": message, "traceback": f"Traceback\nUnsupported: {message}"}
    tagged = progress.cell(CellRecord(0, 1, status=OK, error=error), 2)
    assert tagged == ["[1/2] In[1] ok 0 µs · raised Unsupported: Data-dependent branching (tagged raises-exception: "
                      "the run goes on)"]
    failed = progress.cell(CellRecord(0, 1, status=ERROR, error=error), 2)
    assert failed[0] == "[1/2] In[1] error 0 µs · Unsupported: Data-dependent branching"
    assert "  Hint: Use torch.cond." in "\n".join(failed[1:])
