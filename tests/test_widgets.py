"""The live views without a browser: widget model state after known cells, live updates while a cell
runs (counted on a recording comm), throttling, the free button's real message path, closing and
unloading, and the text fallback where there is no widget frontend."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import comm
import pytest
from comm.base_comm import BaseComm
from IPython.utils.capture import capture_output
from shells import loaded_shell, run

from neuron_lab import backend, kinds
from neuron_lab.extension import session_of
from neuron_lab.report.checks_rows import check_summary_line
from neuron_lab.report.html import op_sections_html
from neuron_lab.report.model import Memory, OpRow, as_data
from neuron_lab.report.text import op_sections
from neuron_lab.widgets import VIEWS, snapshot, static
from neuron_lab.widgets.panel import Panel


class RecordingComm(BaseComm):
    """A comm that keeps what the kernel would send to the browser, with the time it was sent."""

    sent: list[tuple[float, str, dict]] = []

    def publish_msg(self, msg_type, data=None, metadata=None, buffers=None, **keys):
        RecordingComm.sent.append((time.perf_counter(), msg_type, data or {}))


@pytest.fixture
def recording(monkeypatch):
    RecordingComm.sent = []
    monkeypatch.setattr(comm, "create_comm", lambda **kw: RecordingComm(**kw))
    return RecordingComm.sent


@pytest.fixture
def shell(recording):
    with loaded_shell(instance=True) as sh:
        yield sh


def widget_shell(sh):
    run(sh, "%config NeuronLab.display_as = 'widget'")
    return sh


TRAIN = """\
import torch
x = torch.ones(1000, device='neuron')
y = torch.atan2(x, x)
"""


def test_dashboard_widget_state_after_known_cells(shell):
    sh = widget_shell(shell)
    base = backend.active().memory_allocated()  # what earlier tests in this process left
    run(sh, TRAIN)  # In[2]: x and y, 4000 bytes each; one atan2 fallback at line 3
    run(sh, "panel = %neuron dashboard")
    panel = sh.user_ns["panel"]
    assert isinstance(panel, Panel)
    assert panel.views == ["memory", "tensors", "fallbacks", "compiles"]
    d = panel.data
    (row,) = [r for r in d["memory"]["rows"] if r["cell"] == 2]  # the report's own fields: cell, wall_s, memory
    m = row["memory"]
    assert (m["before"], m["after"], m["after"] - m["before"], m["peak"]) == (base, base + 8000, 8000, base + 8000)
    assert set(row) == {"cell", "wall_s", "memory"} and row["wall_s"] > 0
    (op,) = d["fallbacks"]["all"]
    assert (op["op"], op["kind"], op["count"]) == ("aten::atan2.out", "fallback", 1)
    assert [(s["site"]["cell"], s["site"]["line"], s["site"]["source"], s["count"]) for s in op["sites"]] == [
        (2, 3, "y = torch.atan2(x, x)", 1)]
    assert op["shapes"] == [[1000], [1000], [1000]] and op["dtypes"] == ["float32"] * 3
    assert d["fallbacks"]["last"] == 2 and d["fallbacks"]["cell"] == d["fallbacks"]["all"]
    assert d["header"]["coverage"] == backend.active().coverage.name
    assert "%neuron coverage" in d["header"]["coverage_hint"]
    assert panel.live["allocated"] == base + 8000 == backend.active().memory_allocated()
    assert panel.live["capacity"] == backend.active().capacity()
    # the timeline has the cell's two exact samples and its span
    (span,) = [c for c in d["memory"]["cells"] if c["cell"] == 2]
    assert span["start_s"] <= span["end_s"]
    assert [b for t, b in d["memory"]["points"] if span["start_s"] <= t <= span["end_s"]][-1] == base + 8000
    # the next cell refreshes the data: a second atan2 call from another line
    run(sh, "z = torch.atan2(x, x)\nw = torch.atan2(x, x)")
    (op,) = panel.data["fallbacks"]["all"]
    assert op["count"] == 3
    assert [(s["site"]["cell"], s["site"]["line"]) for s in op["sites"]] == [(2, 3), (4, 1), (4, 2)]
    assert panel.data["fallbacks"]["last"] == 4
    assert [r["count"] for r in panel.data["fallbacks"]["cell"]] == [2]  # "this cell": In[4] only


def test_the_widget_json_is_the_report_models_own_data_with_the_kinds_in_the_header(shell):
    sh = widget_shell(shell)
    run(sh, TRAIN)
    run(sh, "panel = %neuron dashboard")
    d = sh.user_ns["panel"].data
    report = session_of(sh).history[d["fallbacks"]["last"]]
    assert d["header"]["kinds"] == kinds.as_json() and d["header"]["titles"] == snapshot.TITLES
    assert [(k, set(m)) for k, m in d["header"]["sections"]] == [(k.name, m) for k, m in kinds.sections()]
    assert all("kinds" not in d[v] for v in VIEWS)  # once, in the header
    # op rows are the report's OpRows as data, and read back into them
    assert d["fallbacks"]["cell"] == as_data(report.ops_not_native)
    assert [OpRow.from_dict(r) for r in d["fallbacks"]["cell"]] == report.ops_not_native
    # a memory row is the report's cell, wall_s and memory; a timeline span is the timeline's CellSpan
    (row,) = [r for r in d["memory"]["rows"] if r["cell"] == report.cell]
    assert row == as_data(report, "cell", "wall_s", "memory") and Memory(**row["memory"]) == report.memory
    assert d["memory"]["cells"] == as_data(session_of(sh).timeline.cells())
    assert json.loads(json.dumps(d)) == d  # plain JSON already: what the browser gets is what Python holds


def test_panel_js_spells_no_kind_and_no_view_title():
    """The widget reads the kinds (neuron_lab.kinds) and the views' titles from the data's header."""
    js = (Path(static.__file__).parent / "panel.js").read_text()
    for k in kinds.KINDS.values():
        assert f'"{k.name}"' not in js and k.title not in js
    for title in snapshot.TITLES.values():
        assert f'"{title}"' not in js


def test_every_view_has_one_builder_and_one_pair_of_renderers():
    assert tuple(snapshot.TITLES) == tuple(snapshot.BUILDERS) == tuple(static.RENDERERS) == VIEWS


def test_static_views_draw_op_rows_with_the_reports_renderers(shell):
    run(shell, TRAIN + "z = torch.ones(3, dtype=torch.float64, device='neuron') * 2\n")
    run(shell, "v = %neuron fallbacks")
    view = shell.user_ns["v"]
    (report,) = session_of(shell).history.values()
    text, html = repr(view), view._bundle()["text/html"]
    assert len(report.sections()) == 2  # CPU fallbacks, 64-bit downcasts
    drawn = "\n".join(op_sections(report.sections()))  # the sections drawn as the report draws them
    assert drawn in text and drawn in str(report)
    assert op_sections_html(report.sections()) in html and op_sections_html(report.sections()) in report._repr_html_()


def test_closing_the_hub_unhooks_it_from_the_session(shell):
    sh = widget_shell(shell)
    run(sh, "panel = %neuron memory")
    session = session_of(sh)
    hub = session.views
    assert hub._cell_started in session.starting and hub._cell_done in session.listeners
    hub.close()
    assert hub._cell_started not in session.starting and hub._cell_done not in session.listeners
    assert session.views is None and sh.user_ns["panel"].comm is None
    run(sh, "import torch\nq = torch.ones(8, device='neuron')")  # cells run on without it
    run(sh, "panel = %neuron memory")
    assert session.views is not None and session.views is not hub


def test_the_views_own_work_stays_out_of_the_cells_report(shell):
    """Opening a view scans the device tensors, and reading a saved tensor runs its unpack hook (``save_on_cpu``
    copies it back to the device): that is the view's work, not the cell's, in a widget or a static view."""
    sh = widget_shell(shell)
    run(sh, "import torch\nw = torch.ones(4, device='neuron', requires_grad=True)\n"
            "with torch.autograd.graph.save_on_cpu():\n    out = (w * 2).exp().sum()")
    reports = []
    session_of(sh).listeners.append(reports.append)
    b = backend.active()
    for cell in ("panel = %neuron dashboard", "%config NeuronLab.display_as = 'static'\nv = %neuron tensors"):
        calls, copies = b.op_calls(), b.transfer_totals()
        run(sh, cell)
        assert b.op_calls() > calls and b.transfer_totals() > copies  # the scan did copy
        assert (reports[-1].ops, reports[-1].h2d_bytes, reports[-1].ops_not_native) == (0, 0, [])


def test_single_views_and_bad_view_names(shell):
    sh = widget_shell(shell)
    for name in ("memory", "tensors", "fallbacks", "compiles"):
        run(sh, f"v = %neuron {name}")
        v = sh.user_ns["v"]
        assert v.views == [name] and set(v.data) == {"header", "as_of", name}
    run(sh, "v = %neuron dashboard fallbacks memory")
    assert sh.user_ns["v"].views == ["fallbacks", "memory"]
    res, _ = run(sh, "%neuron dashboard gpu", ok=False)
    assert "unknown view gpu; views: memory, tensors, fallbacks, compiles" in str(res.error_in_exec)
    res, _ = run(sh, "%neuron memory --all", ok=False)
    assert "unrecognized arguments: --all" in str(res.error_in_exec)


def test_live_updates_move_while_the_cell_runs_and_are_throttled(shell, recording):
    sh = widget_shell(shell)
    run(sh, "%config NeuronLab.widget_refresh_hz = 4.0")
    run(sh, "panel = %neuron memory --live")
    panel = sh.user_ns["panel"]
    mark = len(recording)
    start = time.perf_counter()
    res, _ = run(sh, """\
import time, torch
keep = []
t0 = time.perf_counter()
while time.perf_counter() - t0 < 1.5:
    keep.append(torch.ones(256, device='neuron'))
    torch.atan2(keep[-1], keep[-1])
    time.sleep(0.002)
""")
    end = time.perf_counter()
    during = [(t, d["state"]["live"]) for t, kind, d in recording[mark:]
              if kind == "comm_msg" and "live" in d.get("state", {}) and t < end]
    busy = [live for _, live in during if live.get("busy")]
    # the values moved while the cell ran: memory and the fallback count grew between updates
    assert len({live["allocated"] for live in busy}) >= 3, busy
    assert len({live["fallback_calls"] for live in busy}) >= 3
    assert {live["cell"] for live in busy} - {None} == {res.execution_count}  # None: not compiled yet
    # at most ~4 per second, plus the cell's start and end updates
    assert len(during) <= 4 * (end - start) + 3, len(during)
    # one data refresh after the cell, sent as one message with the idle live state (hold_sync)
    last = [d["state"] for _, kind, d in recording[mark:] if kind == "comm_msg" and "data" in d.get("state", {})]
    assert len(last) == 1 and "live" in last[0] and last[0]["live"]["busy"] is False
    assert panel.live["allocated"] == backend.active().memory_allocated()


def test_refresh_rate_is_configurable(shell, recording):
    sh = widget_shell(shell)
    run(sh, "%config NeuronLab.widget_refresh_hz = 1.0")
    run(sh, "panel = %neuron memory --live")
    mark = len(recording)
    run(sh, "import time, torch\nxs = []\nfor _ in range(30):\n    xs.append(torch.ones(64, device='neuron'))"
            "\n    time.sleep(0.05)")
    live = [d for _, kind, d in recording[mark:] if kind == "comm_msg" and "live" in d.get("state", {})
            and d["state"]["live"].get("busy")]
    assert 1 <= len(live) <= 4, len(live)  # 1.5 s at 1 Hz, plus the cell's start


def test_closing_a_view_stops_its_updates_and_the_thread(shell, recording):
    sh = widget_shell(shell)
    run(sh, "panel = %neuron memory --live")
    panel = sh.user_ns["panel"]
    hub = panel.hub
    assert any(t.name == "neuron_lab-widgets" for t in threading.enumerate())
    panel.close()
    assert panel.comm is None and panel not in hub.open_panels()
    mark = len(recording)
    run(sh, "import time, torch\nq = torch.ones(512, device='neuron')\ntime.sleep(0.8)")
    assert [m for m in recording[mark:] if m[1] == "comm_msg"] == []
    deadline = time.time() + 3
    while any(t.name == "neuron_lab-widgets" for t in threading.enumerate()) and time.time() < deadline:
        time.sleep(0.05)
    assert not any(t.name == "neuron_lab-widgets" for t in threading.enumerate())


def test_unload_closes_every_view_and_stops_the_thread(shell, recording):
    sh = widget_shell(shell)
    run(sh, "a = %neuron dashboard\nb = %neuron fallbacks")
    a, b = sh.user_ns["a"], sh.user_ns["b"]
    session = session_of(sh)
    with capture_output():
        sh.run_line_magic("unload_ext", "neuron_lab")
    assert a.comm is None and b.comm is None
    assert not any(t.name == "neuron_lab-widgets" for t in threading.enumerate())
    assert session.starting == [] and session.listeners == []
    mark = len(recording)
    run(sh, "import torch\nr = torch.atan2(torch.ones(3, device='neuron'), torch.ones(3, device='neuron'))")
    assert [m for m in recording[mark:] if m[1] == "comm_msg"] == []
    with capture_output():  # the fixture unloads again: loading again must start clean
        sh.run_line_magic("load_ext", "neuron_lab")


def test_free_button_drops_ipython_references_between_cells(shell):
    sh = widget_shell(shell)
    base = backend.active().memory_allocated()
    run(sh, "import torch\nbig = torch.ones(1 << 16, device='neuron')")
    run(sh, "big")  # Out[3], _ and _3 hold it
    run(sh, "del big")
    run(sh, "panel = %neuron memory")
    panel = sh.user_ns["panel"]
    assert backend.active().memory_allocated() == base + (1 << 18)
    # the browser's click arrives as a custom comm message; ipywidgets routes it to the handler
    panel._handle_msg({"content": {"data": {"method": "custom", "content": {"action": "free"}}}, "buffers": []})
    assert backend.active().memory_allocated() == base
    assert panel.live["allocated"] == base
    assert panel.data["memory"]["freed"].startswith("freed 256.00 KiB of device memory")
    assert "Out" in sh.user_ns and 3 not in sh.user_ns["Out"]


def test_views_hold_no_tensor(shell):
    sh = widget_shell(shell)
    base = backend.active().memory_allocated()
    run(sh, "import torch\nt = torch.ones(4096, device='neuron', requires_grad=True)\nu = (t * 2).sum()")
    run(sh, "panel = %neuron dashboard")
    run(sh, "del t, u")
    assert backend.active().memory_allocated() == base


def test_auto_dashboard_strip_lives_during_the_cell_and_leaves_html(shell, recording):
    sh = widget_shell(shell)
    run(sh, "%config NeuronLab.auto_dashboard = True")
    seen = {}
    code = ("import torch\nfrom neuron_lab.extension import session_of\nfrom neuron_lab import widgets\n"
            "h = widgets.hub_of(session_of(get_ipython()))\nstrips = [p for p, _ in h.strips]\n"
            "x = torch.atan2(torch.ones(8, device='neuron'), torch.ones(8, device='neuron'))")
    res, cap = run(sh, code)
    strips = sh.user_ns["strips"]
    assert len(strips) == 1 and strips[0].views == ["strip"]
    seen["strip"] = strips[0]
    assert strips[0].comm is None  # closed after the cell
    html = [o.data.get("text/html", "") for o in cap.outputs]
    assert any("1 CPU fallback call" in h for h in html), html
    assert session_of(sh) is not None and not seen["strip"].hub


def test_plain_ipython_gets_the_text_view(shell):
    run(shell, TRAIN)
    res, cap = run(shell, "%neuron dashboard")
    text = cap.stdout
    assert "aten::atan2.out" in text and "In[1] line 3: y = torch.atan2(x, x)" in text
    assert "memory: peak" in text and "compiles: 0 frames" in text
    res, cap = run(shell, "%neuron fallbacks")
    assert "In[1] line 3" in cap.stdout and "memory: peak" not in cap.stdout


def test_tensors_view_names_holders_and_matches_memory_allocated(shell):
    sh = widget_shell(shell)
    base = backend.active().memory_allocated()
    run(sh, "import torch\nmodel = torch.nn.Linear(4, 2).to('neuron')\nopt = torch.optim.Adam(model.parameters())\n"
            "model(torch.ones(3, 4, device='neuron')).sum().backward()\nopt.step()")
    run(sh, "torch.ones(5, device='neuron')")  # shown, so Out[N] holds it
    run(sh, "panel = %neuron tensors")
    t = sh.user_ns["panel"].data["tensors"]
    assert t["total"] == t["allocated"] == backend.active().memory_allocated() == base + 160 + 20
    named = {n: (r["bytes"], r["held_by"]) for r in t["rows"] for n in r["names"]}
    assert named["model.weight"] == (32, "namespace") and named["model.bias.grad"] == (8, "namespace")
    assert named["opt.state[model.weight].exp_avg_sq"] == (32, "namespace")
    assert named["Out[3]"] == (20, "IPython output cache")
    assert [r["bytes"] for r in t["rows"]] == sorted((r["bytes"] for r in t["rows"]), reverse=True)


def test_coverage_magic_names_and_switches_the_coverage(shell, tmp_path):
    import json

    b = backend.active()
    before = b.coverage
    res, _ = run(shell, "%neuron coverage")
    assert str(res.result).startswith(f"op coverage: {before.name}, dated {before.date}: {before.source}\n")
    assert before.source.endswith(".") and ".," not in str(res.result)  # the source's own stop ends the line
    assert "switch with `%neuron coverage NAME|FILE`" in str(res.result)
    res, _ = run(shell, "%neuron coverage no-such-coverage", ok=False)
    assert "%neuron coverage: no coverage 'no-such-coverage'" in str(res.error_in_exec)
    assert b.coverage is before
    everything_native = tmp_path / "all-native.json"
    everything_native.write_text(json.dumps({"schema_version": 1, "name": "all-native", "source": "test",
                                             "date": "2026-12-02", "default": {"kind": "native"}}))
    try:
        res, _ = run(shell, f"%neuron coverage {everything_native}")
        assert str(res.result).startswith("op coverage: all-native, dated 2026-12-02: test\n")
        run(shell, "%config NeuronLab.display_as = 'widget'")
        run(shell, TRAIN)
        res, _ = run(shell, "panel = %neuron fallbacks")
        data = shell.user_ns["panel"].data
        assert data["header"]["coverage"] == "all-native" and data["fallbacks"]["all"] == []
    finally:
        b.set_coverage(before.path if before.path and not before.path.startswith("<bundled>") else before.name)
    assert b.coverage.name == before.name


def test_a_free_click_off_the_main_thread_waits_for_the_cell_end(shell):
    """With kernel subshells a click may arrive on another thread, even mid-cell: it must not free then."""
    sh = widget_shell(shell)
    base = backend.active().memory_allocated()
    run(sh, "import torch\ntorch.ones(1 << 10, device='neuron')")  # Out holds 4 KiB
    run(sh, "panel = %neuron memory")
    panel = sh.user_ns["panel"]
    click = threading.Thread(target=panel._handle_msg, args=(
        {"content": {"data": {"method": "custom", "content": {"action": "free"}}}, "buffers": []},))
    click.start()
    click.join()
    assert backend.active().memory_allocated() == base + 4096  # not yet
    run(sh, "pass")
    assert backend.active().memory_allocated() == base
    assert panel.data["memory"]["freed"].startswith("freed 4.00 KiB of device memory")


def test_a_single_view_keeps_its_cells_state_and_live_follows(shell):
    """Issue 17 point 4: `%neuron tensors` shows the state at the end of its own cell and stays so; `--live` and
    the dashboard follow the session."""
    sh = widget_shell(shell)
    base = backend.active().memory_allocated()
    run(sh, "import torch\na = torch.ones(100, device='neuron')")
    res, _ = run(sh, "snap = %neuron tensors\nb = torch.ones(10, device='neuron')")  # b: still this cell's
    run(sh, "follow = %neuron tensors --live")
    run(sh, "c = torch.ones(50, device='neuron')")
    snap, follow = sh.user_ns["snap"], sh.user_ns["follow"]
    assert (snap.follow, follow.follow) == (False, True)
    assert snap.data["tensors"]["total"] == base + 400 + 40 and snap.data["as_of"]["cell"] == res.execution_count
    assert follow.data["tensors"]["total"] == base + 400 + 40 + 200
    assert snap not in session_of(sh).views.open_panels() and follow in session_of(sh).views.open_panels()
    # static views too: a snapshot is not updated after its cell
    run(sh, "%config NeuronLab.display_as = 'static'\nv = %neuron tensors\nw = %neuron tensors --live")
    run(sh, "d = torch.ones(25, device='neuron')")
    v, w = sh.user_ns["v"], sh.user_ns["w"]
    assert v.data["tensors"]["total"] == base + 640 and w.data["tensors"]["total"] == base + 740


def test_live_state_names_the_running_cell_and_its_fallbacks_so_far(shell):
    """Issue 17 point 5: while a cell runs, the live state carries that cell's number and its op rows so far."""
    sh = widget_shell(shell)
    run(sh, "%neuron dashboard")
    run(sh, TRAIN)
    res, _ = run(sh, "from neuron_lab.widgets import snapshot\nfrom neuron_lab.extension import session_of\n"
                     "z = torch.atan2(x, x)\nz = torch.atan2(z, x)\nlive = snapshot.live(session_of(get_ipython()))")
    live = sh.user_ns["live"]
    assert live["busy"] is True and live["cell"] == res.execution_count
    (row,) = live["rows"]
    assert (row["op"], row["count"]) == ("aten::atan2.out", 2)
    assert [(s["site"]["cell"], s["site"]["line"], s["count"]) for s in row["sites"]] == [
        (res.execution_count, 3, 1), (res.execution_count, 4, 1)]
    assert all(s["stacks"] == [] for s in row["sites"])  # sent a few times a second: sites only
    assert live["compiling"] is None
    assert "rows" not in snapshot.live(session_of(sh))  # between cells: the last cell's rows are in the data


def test_an_out_of_memory_cell_is_marked_on_the_timeline(shell):
    sh = widget_shell(shell)
    res, _ = run(sh, "import torch\nbig = torch.empty(2 ** 50, dtype=torch.uint8, device='neuron')", ok=False)
    assert isinstance(res.error_in_exec, torch_oom())
    run(sh, "panel = %neuron memory")
    (mark,) = sh.user_ns["panel"].data["memory"]["marks"]
    assert mark["kind"] == "oom" and mark["label"] == f"out of memory in In[{res.execution_count}]"
    assert mark["t_s"] in [t for t, _ in sh.user_ns["panel"].data["memory"]["points"]]  # the cell's end sample


def torch_oom() -> type:
    import torch

    return torch.OutOfMemoryError


def test_live_state_shows_a_compile_in_progress(shell):
    """Issue 17 point 1: while dynamo compiles, the live state says what, how many graphs so far and how long."""
    sh = widget_shell(shell)
    run(sh, "%neuron dashboard")
    run(sh, """\
import threading, time, torch
from neuron_lab.widgets import snapshot, static
from neuron_lab.extension import session_of
s, seen, stop = session_of(get_ipython()), [], threading.Event()
def poll():
    while not stop.is_set():
        live = snapshot.live(s)
        if live.get("compiling"):
            seen.append((live["compiling"], static.render_text({"header": {}}, live, [])))
        time.sleep(0.002)
t = threading.Thread(target=poll)
t.start()
m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).to('neuron')
y = torch.compile(m, backend='neuron')(torch.ones(2, 8, device='neuron'))
stop.set()
t.join()
""")
    seen = sh.user_ns["seen"]
    assert seen, "no compile seen in progress"
    c, text = seen[-1]
    assert set(c) == {"frame", "graphs", "elapsed_s", "phase", "site", "text"} and c["elapsed_s"] >= 0
    # the progress line's words: the module, else the line that called it (never dynamo's "_call_impl")
    assert re.match(r"compiling (Sequential|the call at In\[\d+\] line \d+): ", c["text"]), c
    assert f"· {c['text']}" in text
    assert snapshot.live(session_of(sh)).get("compiling") is None


def test_static_timeline_has_axes_with_units_readable_cell_labels_and_marks():
    """The HTML view's timeline (nbconvert, `neuron-lab run --html`): the widget's chart by time, as SVG."""
    import re

    points = [[0.0, 0], [0.5, 1 << 19], [9.0, 1 << 20], [9.5, 3 << 18]]
    cells = [{"cell": 1, "start_s": 0.0, "end_s": 0.01}, {"cell": 2, "start_s": 0.02, "end_s": 9.0},
             {"cell": 3, "start_s": 9.01, "end_s": 9.02}, {"cell": 4, "start_s": 9.03, "end_s": 9.5}]
    marks = [{"kind": "oom", "t_s": 9.5, "label": "out of memory in In[4]"}]
    svg = static._svg(points, cells, marks, 1 << 20)
    texts = re.findall(r"<text[^>]*>([^<]*)</text>", svg)
    assert "allocated (MiB)" in texts and "seconds since the session started" in texts
    assert [t for t in texts if t.endswith(" MiB") and t[0].isdigit()] == ["0 MiB", "0.25 MiB", "0.5 MiB",
                                                                            "0.75 MiB", "1 MiB"]
    assert [t for t in texts if t.endswith(" s") and t[0].isdigit()] == ["0 s", "2 s", "4 s", "6 s", "8 s"]
    # every band is drawn and named in its tooltip; labels only where they fit (In[1], In[3] are 10 ms wide)
    assert re.findall(r"<title>(In\[\d\])</title>", svg) == ["In[1]", "In[2]", "In[3]", "In[4]"]
    assert [t for t in texts if t.startswith("In[")] == ["In[2]"]
    assert "OOM" in texts and "<title>out of memory in In[4]</title>" in svg and "peak 1.00 MiB" in texts


CLIMB = """
import time
xs = []
for i in range(5):
    xs.append(torch.empty(2**20, dtype=torch.uint8, device=device))
    time.sleep(0.06)
del xs
"""


def _in_cell(sh, n: int) -> list[int]:
    tl = session_of(sh).timeline
    (span,) = [c for c in tl.cells() if c.cell == n]
    return [b for t, b in tl.points() if span.start_s <= t <= span.end_s]


def test_the_memory_timeline_samples_a_cells_climb_with_no_view_open(shell):
    run(shell, "import torch\nbase = torch.neuron.memory_allocated()")
    base = shell.user_ns["base"]
    res, _ = run(shell, CLIMB)
    inside = _in_cell(shell, res.execution_count)
    assert max(inside) == base + 5 * 2**20 and inside[0] == inside[-1] == base  # the climb's top, start and end
    assert len({b for b in inside if base < b < base + 5 * 2**20}) >= 2, inside  # steps on the way up, not a line
    assert session_of(shell).sampler.error is None
    run(shell, "%config NeuronLab.memory_sample_ms = 0")
    res, _ = run(shell, CLIMB)
    assert _in_cell(shell, res.execution_count) == [base, base]  # only the cell's start and end: as the setting says
    view = str(run(shell, "%neuron memory")[0].result)
    assert "sampled only at each cell's start and end (NeuronLab.memory_sample_ms = 0)" in view


def test_the_compiles_view_shows_a_check_as_its_one_line_summary(shell):
    """Issue 28 point 9: a parity check is one line in the Compiles tab (the verdict), not its full dump."""
    sh = widget_shell(shell)
    run(sh, "import torch\nx = torch.ones(4, 4, device='neuron')")
    run(sh, "%%neuron parity\ny = (x * 2).sum()")
    run(sh, "panel = %neuron compiles")
    (row,) = [r for r in sh.user_ns["panel"].data["compiles"]["rows"] if r["checks"]]
    (line,) = row["checks"]
    check = session_of(sh).history[row["cell"]].checks[0]
    assert line == check_summary_line(check) and "\n" not in line and line.startswith("parity neuron:0 vs cpu: ")
    assert len(str(check).splitlines()) > 1  # what the tab showed before: the whole result
    text = static.render_text(sh.user_ns["panel"].data, {}, ["compiles"])
    assert f"    {line}" in text.splitlines()


def test_the_tensors_view_shows_a_0d_tensors_shape_as_empty_brackets_in_text_html_and_widget(shell):
    """The widget and the static HTML draw the shape text the data carries, the one its text view shows (the widget
    drew a 0-d shape as (), the HTML a matrix as [4, 8])."""
    sh = widget_shell(shell)
    run(sh, "import torch\nscalar_t = torch.zeros((), device='neuron')\nmatrix_t = torch.zeros(4, 8, device='neuron')")
    run(sh, "panel = %neuron tensors")
    data = sh.user_ns["panel"].data
    lines = static.render_text(data, {}, ["tensors"]).splitlines()
    (line,) = [ln for ln in lines if ln.endswith("scalar_t")]
    assert line.split()[2:5] == ["[]", "float32", "namespace"], line
    html = static.render_html(data, {}, ["tensors"])
    assert 'vertical-align:top">[]</td>' in html and 'vertical-align:top">4×8</td>' in html and "[4, 8]" not in html
    texts = {r["names"][0]: r["shape_text"] for r in data["tensors"]["rows"] if r["names"]}
    assert (texts["scalar_t"], texts["matrix_t"]) == ("[]", "4×8")
    assert [ln for ln in lines if ln.endswith("matrix_t")][0].split()[2] == "4×8"
    js = (Path(static.__file__).parent / "panel.js").read_text()
    assert 'h("td", {}, r.shape_text)' in js and "r.shape.join" not in js


def test_the_dashboards_display_is_updated_to_its_last_state_at_each_cell_end(shell):
    """Issue 28 point 4: the text and HTML beside the widget are not frozen at its creation ("In[2] running")."""
    sh = widget_shell(shell)
    run(sh, "import torch\nx = torch.ones(1000, device='neuron')")
    _, shown = run(sh, "%neuron dashboard")
    (first,) = [o for o in shown.outputs if "application/vnd.jupyter.widget-view+json" in o.data and not o.update]
    assert first.transient["display_id"] and first.data["text/plain"].splitlines()[-1].startswith("snapshot while In[")
    _, later = run(sh, "y = torch.atan2(x, x)")
    (update,) = [o for o in later.outputs if o.update]
    assert update.transient == first.transient and update.data.keys() == first.data.keys()
    n = session_of(sh).locator.newest_cell()
    assert update.data["text/plain"].splitlines()[-1] == f"snapshot at the end of In[{n}], not live"
    assert f"In[{n}] line 1: y = torch.atan2(x, x)" in update.data["text/plain"]
    assert f"snapshot at the end of In[{n}], not live" in update.data["text/html"]


def test_the_static_tensors_and_compiles_views_say_how_many_rows_they_left_out(shell):
    """Walkthrough 47 point 6: "27 storages" over 20 rows read as the whole list; the compiles view cut silently."""
    run(shell, "%config NeuronLab.display_as = 'static'\nimport torch\n"
               f"ts = [torch.ones(i + 1, device='neuron') for i in range({static.ROWS + 7})]")
    run(shell, "%%neuron parity\ny = ts[0] * 2")  # a row of the compiles view
    _, printed = run(shell, "%neuron tensors")
    run(shell, "v = %neuron tensors\nc = %neuron compiles")
    v, c = shell.user_ns["v"], shell.user_ns["c"]
    n = len(v.data["tensors"]["rows"])
    assert n >= static.ROWS + 7
    assert f"\n  … {n - static.ROWS} more storages\n" in printed.stdout
    assert f"… {n - static.ROWS} more storages</div>" in static.render_html(v.data, {}, ["tensors"])
    (row,) = c.data["compiles"]["rows"]
    compiled = static.ROWS + 3
    c.data["compiles"]["rows"] = [{**row, "cell": i} for i in range(compiled)]
    assert f"  … {compiled - static.ROWS} earlier cells" in static.render_text(c.data, {}, ["compiles"]).splitlines()
    assert f"… {compiled - static.ROWS} earlier cells</div>" in static.render_html(c.data, {}, ["compiles"])
    few = {**v.data, "tensors": {**v.data["tensors"], "rows": v.data["tensors"]["rows"][:3]}}
    assert "more" not in static.render_text(few, {}, ["tensors"]) + static.render_html(few, {}, ["tensors"])


def test_the_memory_lines_timeline_covers_the_session_scaled_to_the_peak_it_names():
    """Walkthrough 48: the text timeline drew the last 60 samples scaled to their own highest, so 1 KiB in use after
    a 95 MiB peak was a full bar beside "peak 95.37 MiB"."""
    peak = 100 << 20
    points = [(i, peak if i < 10 else 1024) for i in range(200)]
    line = static._spark(points, peak)
    assert len(line) == 60 and line[0] == static.BLOCKS[-1] and set(line[4:]) == {static.BLOCKS[0]}
    assert static._spark(points[150:], peak) == static.BLOCKS[0] * 50  # after the peak: low bars, not full ones
    assert static._spark([], peak) == ""
