"""The extension in a real Jupyter kernel: nbclient runs a notebook on ipykernel, the way a user's notebook runs.

Unlike the in-process shell tests, this goes through ipykernel's execute path, its display publisher
(the report arrives as a ``display_data`` message with text/plain and text/html), its cell file names
(``/tmp/ipykernel_…/….py``) and its execution counts. The notebook is built here with nbformat and run
once per module; each test checks one cell's outputs (or the kernel-side history the last cell prints).

Under pytest-xdist the workers share one run: the first to get there executes the notebook, the others
read its result (the pattern pytest-xdist documents for expensive session data).

The kernel is the "python3" kernelspec, whose ``python`` jupyter_client replaces with the interpreter
running pytest, so run it with the project's venv: ``.venv/bin/python -m pytest tests/test_kernel_notebook.py``.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import nbclient
import nbformat
import pytest
from filelock import FileLock  # a dependency of torch

from neuron_lab.report.waits import COMPILED, LOADED
from neuron_lab.session.waits import MIME as PROGRESS

ROOT = Path(__file__).resolve().parents[1]
CELL_TIMEOUT = 300  # seconds per cell; the first torch.compile imports inductor
ANSI = re.compile(r"\x1b\[[0-9;]*m")

FALLBACK_SOURCE = "y = torch.atan2(x, x + 1)"
IF_SOURCE = "if t.sum() > 0:"

# Cell N of the notebook runs as In[N]: a fresh kernel counts from 1 and every cell stores history.
CELLS = [
    # In[1]: every compile shows its progress line (the default, 0.7 s, would make the test depend on the machine)
    "%load_ext neuron_lab\n%config NeuronLab.compile_progress_s = 0",
    # In[2]
    "import torch\n"
    "%neuron device neuron\n"
    "assert device == torch.device('neuron', 0), device\n"
    "device",
    # In[3]: the fallback is on line 2
    "x = torch.randn(64, 2, device=device)\n"
    f"{FALLBACK_SOURCE}",
    # In[4]: the magic is line 1, the data-dependent `if` (a graph break) line 4
    "%%neuron compile\n"
    "class Net(torch.nn.Module):\n"
    "    def forward(self, t):\n"
    f"        {IF_SOURCE}\n"
    "            return t * 2\n"
    "        return t - 1\n"
    "net = Net()\n"
    "out = net(torch.ones(4, device=device))\n"
    "out.sum().item() + 0.5",
    # In[5]
    "%neuron report all",
    # In[6]: prints the history for the tests below, then checks it inside the kernel
    """\
import json, sys
from neuron_lab.extension import session_of

s = session_of(get_ipython())
assert s is not None, "no session: the extension is not loaded"


def summary(r):
    return {
        "title": r.title, "cell": r.cell, "device": r.device, "mode": r.mode, "error": r.error,
        "touched_device": r.touched_device,
        "ops_not_native": [[o.op, o.kind, o.count, [[sc.site.cell, sc.site.line, sc.site.source, sc.count]
                                                    for sc in o.sites]] for o in r.ops_not_native],
        "graphs": r.compiles.graphs, "recompiles": len(r.compiles.recompiles),
        "breaks": [[b.site.cell, b.site.line, b.site.source] if b.site else None for b in r.compiles.breaks],
        "break_reasons": [b.reason for b in r.compiles.breaks],
    }


t = s.totals
print(json.dumps({
    "executable": sys.executable,
    "history": {str(k): summary(v) for k, v in s.history.items()},
    "totals": [t.cells, t.fallback_calls, t.graph_breaks, t.recompiles],
}))

assert 3 in s.history and 4 in s.history, list(s.history)
r = s.history[3]
atan2 = [o for o in r.ops_not_native if o.op == "aten::atan2.out"]
assert len(atan2) == 1 and atan2[0].count == 1, [(o.op, o.count) for o in r.ops_not_native]
assert (r.title, r.cell) == ("In[3]", 3), (r.title, r.cell)
site = atan2[0].sites[0].site
assert (site.cell, site.line, site.source) == (3, 2, "y = torch.atan2(x, x + 1)"), site
c = s.history[4].compiles
assert len(c.breaks) == 1 and (c.breaks[0].site.cell, c.breaks[0].site.line) == (4, 4), c.breaks
""",
    # In[7]: a profiled cell (after the history cell, so the history it prints is the cells above)
    "%%neuron profile\n"
    "z = torch.atan2(x, x + 1).sum()",
]


def _notebook() -> Any:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    return nb


def _execute(tmp: Path) -> Any:
    """The notebook, executed in a fresh python3 kernel (errors stay in the outputs, for the tests); every progress
    line the kernel sent, in order, goes in its metadata (``progress``: cell index, message type, the line's data)."""
    notebook = _notebook()
    client = nbclient.NotebookClient(notebook, timeout=CELL_TIMEOUT, startup_timeout=120, kernel_name="python3",
                                     allow_errors=True, resources={"metadata": {"path": str(ROOT)}})
    sent: list[dict[str, Any]] = []
    notebook.metadata["progress"] = sent
    process_message = client.process_message

    def recording(msg: dict[str, Any], cell: Any, cell_index: int) -> Any:
        data = msg.get("content", {}).get("data", {})
        if msg["msg_type"] in ("display_data", "update_display_data") and PROGRESS in data:
            sent.append({"cell": cell_index, "type": msg["msg_type"], **data[PROGRESS]})
        return process_message(msg, cell, cell_index)

    client.process_message = recording
    # A private IPython profile: no user startup files or config, no writes to ~/.ipython.
    client.execute(env={**os.environ, "IPYTHONDIR": str(tmp / "ipython")})
    return notebook


@pytest.fixture(scope="module")
def nb(tmp_path_factory: pytest.TempPathFactory) -> Any:
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        tmp = tmp_path_factory.mktemp("kernel_notebook")
        notebook = _execute(tmp)
        nbformat.write(notebook, tmp / "extension_smoke.ipynb")  # for a look when a test fails
        return notebook
    shared = tmp_path_factory.getbasetemp().parent  # this run's, common to its workers
    path = shared / "kernel_notebook" / "extension_smoke.ipynb"
    with FileLock(str(shared / "kernel_notebook.lock")):
        if not path.is_file():
            path.parent.mkdir(exist_ok=True)
            nbformat.write(_execute(path.parent), path)
    return nbformat.read(path, as_version=4)


def _cell(nb: Any, n: int) -> Any:
    """Cell In[n], after checking it ran as In[n] and raised nothing."""
    cell = nb.cells[n - 1]
    errors = [ANSI.sub("", "\n".join(o.traceback)) for o in cell.outputs if o.output_type == "error"]
    assert not errors, f"cell {n} raised:\n" + "\n".join(errors)
    assert cell.execution_count == n
    return cell


def _of(cell: Any, kind: str) -> list[Any]:
    return [o for o in cell.outputs if o.output_type == kind]


def _stdout(cell: Any) -> str:
    return "".join(o.text for o in _of(cell, "stream") if o.name == "stdout")


def _report(cell: Any) -> tuple[list[str], str]:
    """The one auto-report shown after the cell: its text/plain lines and its HTML."""
    shown = [o for o in _of(cell, "display_data") if PROGRESS not in o.data]
    assert len(shown) == 1, f"expected one report display, got {[o.data.keys() for o in shown]}"
    data = shown[0].data
    assert {"text/plain", "text/html"} <= set(data), sorted(data)
    assert data["text/html"].startswith("<div class='neuron-lab-report'>")
    return data["text/plain"].splitlines(), data["text/html"]


def _printed(nb: Any) -> Any:
    """What the history cell, In[6], printed (before its own asserts)."""
    out = _stdout(nb.cells[5]).strip().splitlines()
    assert out, "the history cell printed nothing"
    return json.loads(out[-1])


def test_kernel_runs_this_interpreter(nb: Any) -> None:
    assert [c.execution_count for c in nb.cells] == list(range(1, len(CELLS) + 1))
    printed = _printed(nb)
    assert os.path.realpath(printed["executable"]) == os.path.realpath(sys.executable)


def test_load_ext_prints_the_banner(nb: Any) -> None:
    cell = _cell(nb, 1)
    lines = _stdout(cell).splitlines()
    assert len(lines) == 1, lines
    banner = lines[0]
    assert banner.startswith("neuron_lab 0.1.0: emulator backend"), banner
    assert " · device neuron:0 · " in banner and banner.endswith(" · mode default · compiled core"), banner
    assert _of(cell, "display_data") == []  # loading touches no device: no report


def test_device_magic_sets_the_notebook_device(nb: Any) -> None:
    cell = _cell(nb, 2)  # the cell asserts `device == torch.device('neuron', 0)` itself
    assert _stdout(cell) == "notebook device: neuron:0\n"
    (result,) = _of(cell, "execute_result")
    assert result.data["text/plain"] == "device(type='neuron', index=0)"
    assert result.execution_count == 2
    assert _of(cell, "display_data") == []  # nothing ran on the device: no report


def test_fallback_report_names_op_cell_and_line(nb: Any) -> None:
    cell = _cell(nb, 3)
    n = cell.execution_count
    text, html = _report(cell)
    assert text[0].startswith(f"neuron_lab In[{n}] · neuron:0 · default · "), text[0]
    assert "· 2 CPU fallback calls (2 ops) ·" in text[0], text[0]
    assert [line for line in text if line.startswith("CPU fallbacks")] == [text[2]], text  # after the memory line
    assert text[2].startswith("CPU fallbacks (2 ops, 2 calls, ") and text[2].endswith(" on the host):"), text[2]
    rows = {line.split()[0]: i for i, line in enumerate(text) if line.startswith("  aten::")}
    assert sorted(rows) == ["aten::atan2.out", "aten::normal_"], text
    i = rows["aten::atan2.out"]
    assert re.match(r"  aten::atan2\.out +1× .* why \[\d\]$", text[i]), text[i]
    # its rewrite under the combined default (its ops are registered in the April source), then its line
    assert text[i + 1].startswith("      rewrite: a polynomial of min(|x|, |y|)") and text[i + 1].endswith(
        "(`%neuron report --full` shows the code)"), text[i + 1]
    assert text[i + 2] == f"      at In[{n}] line 2: {FALLBACK_SOURCE}  (1×)"
    j = rows["aten::normal_"]
    assert text[j + 1] == f"      at In[{n}] line 1: x = torch.randn(64, 2, device=device)  (1×)"
    why = text.index("why:")  # each reason once, after the rows, with its source
    assert [x[:6] for x in text[why + 1:] if x.startswith("  [")] == ["  [1] ", "  [2] "], text
    assert f"neuron_lab In[{n}] · neuron:0 · default · " in html
    assert "<code>aten::atan2.out</code>" in html
    assert f"<code>In[{n}] line 2</code> {FALLBACK_SOURCE} (1×)" in html
    assert "<summary>rewrite: a polynomial" in html and "def atan2_native(" in html
    assert _of(cell, "execute_result") == []


def test_compile_cell_reports_the_graph_break_and_returns_the_value(nb: Any) -> None:
    cell = _cell(nb, 4)
    n = cell.execution_count
    (result,) = _of(cell, "execute_result")
    assert result.data["text/plain"] == "8.5"  # ones(4) * 2, summed, + 0.5: the `if` took the tensor's branch
    assert result.execution_count == n
    text, html = _report(cell)
    head = text[0]
    assert head.startswith(f"neuron_lab In[{n}] · neuron:0 · compile · "), head
    assert "· no CPU fallbacks ·" in head and head.endswith(" · 2 graphs, 1 break, 0 recompiles"), head
    breaks = [i for i, line in enumerate(text) if line.startswith("  graph break at ")]
    assert len(breaks) == 1, text
    assert text[breaks[0]] == f"  graph break at In[{n}] line 4: {IF_SOURCE}"
    assert text[breaks[0] + 1].startswith("      why: ") and text[breaks[0] + 1].strip() != "why:"
    assert f"vertical-align:top\"><code>In[{n}] line 4</code> if t.sum() &gt; 0:</td>" in html
    assert "if t.sum() &gt; 0:" in html and ">graph break<" in html
    assert "Python <code>if</code>/<code>while</code> on a tensor" in html and "`" not in html  # `code` as <code>


def test_a_first_compile_shows_its_progress_in_plain_words_and_the_report_replaces_it(nb: Any) -> None:
    """In[4] is the kernel's first compile (the compiler loads, then Net compiles): one display in the cell, updated
    in place through its display_id, in plain words, emptied when the cell ends; its report comes after it."""
    sent = [p for p in nb.metadata["progress"] if p["cell"] == 3]
    assert not [p for p in nb.metadata["progress"] if p["cell"] != 3]  # no other cell compiled for long
    assert [p["type"] for p in sent[:1]] == ["display_data"] and len(sent) >= 2, sent
    assert {p["type"] for p in sent[1:]} == {"update_display_data"}, sent
    steps = list(dict.fromkeys(p["step"] for p in sent[:-1]))
    assert steps[0] == "loading PyTorch's compiler (once a session)", steps
    for step in steps[1:]:  # which steps a tick catches depends on the machine; each is in these words
        assert step in (COMPILED, LOADED) or re.fullmatch(
            r"compiling Net: (reading its Python code \(graph \d+\)|"
            r"lowering graph \d+ to the neuron device)", step), steps
    for p in sent[:-1]:
        assert p["text"] in (COMPILED, LOADED) or re.fullmatch(re.escape(p["step"]) + r" — \d+ s", p["text"]), p
        assert "wrapper" not in p["text"] and "dynamo" not in p["text"] and "\r" not in p["text"], p
    assert (sent[-1]["text"], sent[-1]["step"]) == ("", "")  # emptied for the report
    cell = _cell(nb, 4)
    displays = _of(cell, "display_data")
    assert displays[0].data["text/plain"] == "" and PROGRESS in displays[0].data  # the line, emptied
    assert displays[-1].data["text/plain"].startswith("neuron_lab In[4] ")  # the report, after it
    text, _ = _report(cell)
    assert text[1].startswith("compile: ") and "of it loading PyTorch's compiler, once a session)" in text[1], text


def test_report_all_lists_every_reported_cell(nb: Any) -> None:
    cell = _cell(nb, 5)
    (result,) = _of(cell, "execute_result")
    lines = result.data["text/plain"].splitlines()
    # history keeps the cells that touched the device: not In[1] (loading) nor In[2] (choosing the device)
    assert [line.split(" · ")[0] for line in lines] == ["neuron_lab In[3]", "neuron_lab In[4]"]
    assert lines[0].startswith("neuron_lab In[3] · neuron:0 · default · ") and \
        "· 2 CPU fallback calls (2 ops) ·" in lines[0], lines[0]
    assert lines[1].startswith("neuron_lab In[4] · neuron:0 · compile · ") and \
        lines[1].endswith(" · 2 graphs, 1 break, 0 recompiles"), lines[1]
    html = result.data["text/html"]
    assert html.count("<div style='font-family:monospace;font-size:12px'>neuron_lab In[") == 2
    assert _of(cell, "display_data") == []  # reading reports touches no device


def test_session_history_in_the_kernel(nb: Any) -> None:
    printed = _printed(nb)
    history = printed["history"]
    assert list(history) == ["3", "4"]  # the cells that touched the device
    for k, r in history.items():
        assert (r["title"], r["cell"], r["device"], r["error"]) == (f"In[{k}]", int(k), "neuron:0", None)
    assert [r["mode"] for r in history.values()] == ["default", "compile"]
    assert [r["touched_device"] for r in history.values()] == [True, True]
    assert sorted(history["3"]["ops_not_native"]) == [
        ["aten::atan2.out", "fallback", 1, [[3, 2, FALLBACK_SOURCE, 1]]],
        ["aten::normal_", "fallback", 1, [[3, 1, "x = torch.randn(64, 2, device=device)", 1]]],
    ], history["3"]["ops_not_native"]
    compiled = history["4"]
    # the compiled cell's only rows are syncs: the graph break's `if` and the last line's `.item()` read the device
    assert {(o[0], o[1]) for o in compiled["ops_not_native"]} <= {("item", "sync")}, compiled["ops_not_native"]
    assert compiled["breaks"] == [[4, 4, IF_SOURCE]]
    assert compiled["break_reasons"][0], compiled["break_reasons"]
    assert (compiled["graphs"], compiled["recompiles"]) == (2, 0)
    assert history["3"]["breaks"] == [] and history["3"]["graphs"] == 0
    # cells reported, CPU fallback calls (atan2 + normal_), graph breaks, recompiles
    assert printed["totals"] == [2, 2, 1, 0]
    _cell(nb, 6)  # and the kernel's own asserts on the history passed


def test_a_profiled_cell_shows_no_kineto_line_and_labels_the_emulators_device_time_as_host_time(nb: Any) -> None:
    """Kineto writes its session lines to the process's stderr, which a kernel shows in red under the cell."""
    cell = _cell(nb, 7)
    assert [o.text for o in _of(cell, "stream") if o.name == "stderr"] == []
    text, html = _report(cell)
    assert " · profiled: device (host clock) " in text[0], text[0]
    assert "ops by device (host clock) + host time:" in text
    assert "<b>ops by device (host clock) + host time</b>" in html
