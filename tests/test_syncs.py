"""Device-to-host syncs (issue 32): every read a cell forces is in its report at its line with its count and
reason, and the workbench itself adds at most one device synchronize a cell (issue 31). Run on both cores."""

from __future__ import annotations

import pytest
from shells import run

from neuron_lab import backend, kinds
from neuron_lab.extension import session_of
from neuron_lab.report.text import render_text


def _report(shell, code: str):
    res, _ = run(shell, code)
    return session_of(shell).history[res.execution_count]


def _syncs(r) -> dict[str, tuple[int, list[tuple[int, int]]]]:
    """reason -> (count, [(line, count)])"""
    return {row.op: (row.count, [(s.site.line, s.count) for s in row.sites]) for row in r.syncs}


def test_an_item_per_step_is_one_line_with_its_count(shell) -> None:
    run(shell, "import torch\nx = torch.ones(4, device='neuron')")
    r = _report(shell, "total = 0.0\nfor i in range(7):\n    total += (x * i).sum().item()")
    assert _syncs(r) == {"item": (7, [(3, 7)])}
    text = str(r).splitlines()
    assert "· 7 syncs ·" in text[0], text
    assert text[-1] == (f"device-to-host syncs: 7 (item ×7 at In[{r.cell}] line 3) — `%neuron report --full` lists "
                        "them"), text  # one line, as a clean cell's report stays short
    full = render_text(r, "full").splitlines()
    assert full.count(kinds.KINDS[kinds.SYNC].why.join(["  ", ""])) == 1, full
    assert any(line.startswith("      at In[") and "line 3: " in line and "(7×)" in line for line in full), full
    html = r._repr_html_()
    assert "device-to-host syncs" in html and "Adaptive Eager" in html
    (row,) = r.as_dict()["ops_not_native"]
    assert (row["op"], row["kind"], row["count"]) == ("item", kinds.SYNC, 7)
    r = _report(shell, "steps = torch.arange(3, device='neuron')\nlast = steps[-1].item()")
    assert str(r).splitlines()[-1].startswith("device-to-host syncs: 1 (item ×1 at"), str(r)  # no int64→int32 words


def test_a_syncs_one_line_counts_each_line_as_its_own(shell) -> None:
    """The op's count is not its busiest line's: the one line says that line's own count and how many lines more."""
    run(shell, "import torch\nx = torch.ones(4, device='neuron')")
    r = _report(shell, "for i in range(3):\n    u = x.sum().item()\nv = x.max().item()")
    assert _syncs(r) == {"item": (4, [(2, 3), (3, 1)])}
    assert str(r).splitlines()[-1] == (f"device-to-host syncs: 4 (item ×4 at In[{r.cell}] line 2 (3×), 1 more site) — "
                                       "`%neuron report --full` lists them"), str(r)


def test_print_tolist_cpu_nonzero_and_if_each_at_their_line(shell) -> None:
    run(shell, "import torch\nx = torch.ones(4, device='neuron')")
    r = _report(shell, "print(x)\ny = x.tolist()\nz = x.cpu()\nn = torch.nonzero(x)\nif x.sum():\n    pass")
    got = _syncs(r)
    assert set(got) == {"print", "tolist", "cpu copy", "data-dependent shape", "item"}, got
    assert got["print"][1] == [(1, got["print"][0])] and got["print"][0] >= 1  # torch's formatter reads several times
    assert got["tolist"] == (1, [(2, 1)])
    assert got["cpu copy"] == (1, [(3, 1)])
    assert got["data-dependent shape"] == (1, [(4, 1)])
    assert got["item"] == (1, [(5, 1)])


def test_a_cell_without_reads_reports_no_syncs(shell) -> None:
    run(shell, "import torch\nx = torch.ones(4, device='neuron')")
    r = _report(shell, "y = (x * 2).relu()")
    assert r.syncs == [] and "sync" not in str(r)


def test_the_workbenchs_own_reads_are_not_the_users(shell) -> None:
    """A tensors view and the cell's value shown in Out[] read the device for the workbench and IPython, not for the
    cell's code: no sync rows."""
    run(shell, "import torch\nx = torch.arange(4.0, device='neuron')")
    r = _report(shell, "y = x * 2\nv = %neuron tensors\ny")
    assert r.syncs == [], [(row.op, row.count) for row in r.syncs]


def test_the_dashboard_strip_counts_the_last_cells_syncs(shell) -> None:
    from neuron_lab.widgets import snapshot, static

    run(shell, "import torch\nx = torch.ones(4, device='neuron')")
    r = _report(shell, "for _ in range(3):\n    x.sum().item()")
    live = snapshot.live(session_of(shell))
    assert live["syncs"] == r.sync_calls == 3
    assert ", 3 syncs" in static._strip_line({}, live)


def test_the_workbench_adds_at_most_one_synchronize_a_cell_and_no_reads(shell) -> None:
    """A training cell that reads nothing back: the workbench's own synchronize (memory, after the cell) is the only
    one, with the dashboard open too, and none of its own reads is a device-to-host sync."""
    run(shell, "import torch\nm = torch.nn.Linear(8, 8).to('neuron')\nopt = torch.optim.AdamW(m.parameters())\n"
               "x = torch.randn(4, 8, device='neuron')\npanel = %neuron dashboard")
    step = "for _ in range(3):\n    opt.zero_grad()\n    m(x).sum().backward()\n    opt.step()"
    run(shell, step)
    b = backend.active()
    reads: list[object] = []
    unsubscribe = b.subscribe(lambda e, *_: reads.append(e), frozenset({kinds.SYNC}))
    try:
        before = b.synchronizes
        for _ in range(3):
            assert _report(shell, step).syncs == []
        assert b.synchronizes - before == 3
        assert reads == []
    finally:
        unsubscribe()


# -- over the real-TorchNeuron adapter (its dispatch-mode observer sees the same ATen reads), against the fake ---------
ADAPTER = """
import json
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
from neuron_lab.extension import session_of
sh = InteractiveShell()
with capture_output():
    sh.run_line_magic("load_ext", "neuron_lab")
    sh.run_cell("import torch\\nx = torch.ones(4, device='neuron')", store_history=True)
    res = sh.run_cell("for i in range(3):\\n    v = x.sum().item()\\nz = x.cpu()\\nn = torch.nonzero(x)",
                      store_history=True)
r = session_of(sh).history[res.execution_count]
print(json.dumps({row.op: [row.count, [[s.site.line, s.count] for s in row.sites]] for row in r.syncs}))
"""


@pytest.mark.core_in_child  # the stand-in's child gets no NEURON_LAB_ variables: the same run in either pass
def test_syncs_over_the_torchneuron_adapter() -> None:
    from fake_torchneuronx import SITE
    from fake_torchneuronx import run as run_child

    assert run_child(ADAPTER, site=SITE, timeout=180).json() == {
        "item": [3, [[2, 3]]], "cpu copy": [1, [[3, 1]]], "data-dependent shape": [1, [[4, 1]]]}
