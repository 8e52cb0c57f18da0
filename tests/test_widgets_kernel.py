"""The views in a real kernel without a browser, as nbclient (and so ``neuron-lab run`` and CI) sees them.

nbclient keeps the widgets' last state in the notebook's metadata (``store_widget_state``), and applies
``update_display_data`` to the outputs it targets: so a saved notebook shows the dashboard's final data,
a static view asked for ``--live`` (``NeuronLab.display_as = 'static'``) the state after the last cell, and
a single view without ``--live`` the state at the end of its own cell (issue 17 point 4), in a notebook
executed by nbclient and in one run by ``neuron-lab run``. Beside the widget, its display's text and HTML are
a snapshot of its last state, stamped as one (the end of each cell updates the display), so an nbconvert export
or an untrusted notebook shows the last state, not the one the view had when it was made (issue 28 point 4).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import nbclient
import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
ANSI = re.compile(r"\x1b\[[0-9;]*m")
WIDGET = "application/vnd.jupyter.widget-view+json"
STATE = "application/vnd.jupyter.widget-state+json"

CELLS = [
    "%load_ext neuron_lab",  # In[1]
    "import torch\nx = torch.ones(100, device='neuron')",  # In[2]
    "%neuron dashboard",  # In[3]
    "%config NeuronLab.display_as = 'static'\n%neuron fallbacks --live",  # In[4]
    "w = torch.ones(10, device='neuron')\ny = torch.atan2(x, x)",  # In[5]: the fallback is line 2
    "%neuron compiles",  # In[6]: static too
    "%neuron tensors",  # In[7]: a static snapshot: x, w, y
    "del y",  # In[8]
    "%neuron tensors",  # In[9]: x, w
    "%config NeuronLab.display_as = 'widget'\n%neuron tensors",  # In[10]: a widget snapshot: x, w
    "z = torch.ones(1000, device='neuron')",  # In[11]
]
DASHBOARD_RUN = [
    "%load_ext neuron_lab",  # In[1]
    "import torch\nx = torch.ones(100, device='neuron')",  # In[2]
    "%neuron dashboard",  # In[3]: first displayed while In[3] runs
    "y = torch.atan2(x, x)",  # In[4]
    "w = torch.ones(1000, device='neuron')",  # In[5]
]
TWO_VIEWS = [  # notebook 03's shape: a tensor view, then a change, then another view
    "%load_ext neuron_lab",
    "import torch\nacts = torch.ones(256, device='neuron')\nacts[:2]",  # Out[2] holds the 1 KiB batch
    "%neuron tensors",
    "del acts\n%neuron free",
    "%neuron tensors",
]


@pytest.fixture(scope="module")
def nb(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("widgets_kernel")
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    notebook.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    client = nbclient.NotebookClient(notebook, timeout=300, startup_timeout=120, kernel_name="python3",
                                     allow_errors=True, store_widget_state=True,
                                     resources={"metadata": {"path": str(ROOT)}})
    client.execute(env={**os.environ, "IPYTHONDIR": str(tmp / "ipython")})
    nbformat.write(notebook, tmp / "widgets.ipynb")
    for i, cell in enumerate(notebook.cells, 1):
        errors = [ANSI.sub("", "\n".join(o.traceback)) for o in cell.outputs if o.output_type == "error"]
        assert not errors, f"cell {i} raised:\n" + "\n".join(errors)
    return notebook


def _bundles(cell: Any) -> list[dict]:
    return [o.data for o in cell.outputs if o.output_type in ("display_data", "execute_result")]


def _run(tmp_path: Path, cells: list[str], *args: str) -> Any:
    """``neuron-lab run`` of a notebook of ``cells``, ``--output out.ipynb`` and ``args``: the notebook it wrote."""
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    nbformat.write(notebook, tmp_path / "views.ipynb")
    env = {**os.environ, "IPYTHONDIR": str(tmp_path / "ipython")}
    proc = subprocess.run([sys.executable, "-m", "_neuron_lab_cli", "run", "views.ipynb", "--output", "out.ipynb",
                           *args], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return nbformat.read(tmp_path / "out.ipynb", as_version=4)


def test_dashboard_is_a_widget_with_text_and_html_fallbacks(nb: Any) -> None:
    (bundle,) = [b for b in _bundles(nb.cells[2]) if WIDGET in b]
    assert bundle["text/plain"].startswith("neuron_lab · neuron:0 · mode default · ")
    assert "<div class='neuron-lab-static'>" in bundle["text/html"]
    model_id = bundle[WIDGET]["model_id"]
    state = nb.metadata["widgets"][STATE]["state"][model_id]
    assert state["model_name"] == "AnyModel"
    # the saved state is the last one sent: after In[6], with In[5]'s fallback and its line
    data = state["state"]["data"]
    (op,) = data["fallbacks"]["all"]
    assert (op["op"], op["count"]) == ("aten::atan2.out", 1)
    assert [(s["site"]["cell"], s["site"]["line"], s["site"]["source"]) for s in op["sites"]] == [
        (5, 2, "y = torch.atan2(x, x)")]
    assert data["tensors"]["total"] == data["tensors"]["allocated"] == 400 + 40 + 4000  # after In[11]
    assert state["state"]["live"]["busy"] is False and state["state"]["follow"] is True


def test_static_view_is_updated_in_place_after_each_cell(nb: Any) -> None:
    bundles = _bundles(nb.cells[3])
    assert len(bundles) == 1 and WIDGET not in bundles[0]
    text = bundles[0]["text/plain"]
    assert "aten::atan2.out" in text and "In[5] line 2: y = torch.atan2(x, x)" in text, text
    assert "aten::atan2.out" in bundles[0]["text/html"]


def _tensor_lines(cell: Any) -> list[str]:
    (bundle,) = _bundles(cell)
    return bundle["text/plain"].splitlines()[1:]


def test_single_views_keep_the_state_of_their_cell(nb: Any) -> None:
    """After the whole notebook ran, each `%neuron tensors` still shows its own cell's tensors."""
    assert _tensor_lines(nb.cells[6])[0] == "device tensors: 3 storages, 840 B (memory_allocated 840 B)"
    assert _tensor_lines(nb.cells[8])[0] == "device tensors: 2 storages, 440 B (memory_allocated 440 B)"
    (bundle,) = [b for b in _bundles(nb.cells[9]) if WIDGET in b]
    state = nb.metadata["widgets"][STATE]["state"][bundle[WIDGET]["model_id"]]["state"]
    assert state["follow"] is False and state["data"]["as_of"]["cell"] == 10
    assert sorted(n for r in state["data"]["tensors"]["rows"] for n in r["names"]) == ["w", "x"]
    assert bundle["text/plain"].splitlines()[1] == "device tensors: 2 storages, 440 B (memory_allocated 440 B)"
    # the compiles snapshot of In[6] is its cell's, the fallbacks --live view of In[4] followed to the end
    assert "aten::atan2.out" in _bundles(nb.cells[3])[0]["text/plain"]


def test_neuron_lab_run_shows_each_views_own_state(tmp_path: Path) -> None:
    out = _run(tmp_path, TWO_VIEWS)
    first, second = (_bundles(out.cells[i])[0]["text/plain"].splitlines() for i in (2, 4))
    assert first[1] == "device tensors: 1 storages, 1.00 KiB (memory_allocated 1.00 KiB)", first
    assert first[2].split() == ["1.00", "KiB", "256", "float32", "namespace", "acts,", "Out[2],", "_,", "_2"], first
    assert second[1:] == ["device tensors: 0 storages, 0 B (memory_allocated 0 B)",
                          "snapshot while In[5] ran, not live"], second


def test_reports_still_show_under_the_views(nb: Any) -> None:
    texts = [b.get("text/plain", "") for b in _bundles(nb.cells[4])]
    assert any(t.startswith("neuron_lab In[5] · neuron:0 · default · ") for t in texts), texts


def test_neuron_lab_run_saves_the_dashboards_last_state_and_a_snapshot_of_it(tmp_path: Path) -> None:
    out = _run(tmp_path, DASHBOARD_RUN, "--html", "out.html")
    (bundle,) = [b for b in _bundles(out.cells[2]) if WIDGET in b]
    # the widget state, as Jupyter saves it: the state after In[5]
    state = out.metadata["widgets"][STATE]["state"][bundle[WIDGET]["model_id"]]["state"]
    assert state["data"]["as_of"]["cell"] == 5 and state["live"]["busy"] is False
    assert state["data"]["tensors"]["total"] == 400 + 400 + 4000
    # the snapshot beside the widget: the same last state, stamped, not the "In[3] running" it was made with
    text = bundle["text/plain"].splitlines()
    assert "· In[5] " in text[0] and "running" not in text[0], text[0]
    assert "device tensors: 3 storages, 4.69 KiB (memory_allocated 4.69 KiB)" in text
    assert "In[4] line 1: y = torch.atan2(x, x)" in bundle["text/plain"]
    assert text[-1] == "snapshot at the end of In[5], not live"
    html = bundle["text/html"]
    assert "snapshot at the end of In[5], not live" in html and "In[4] line 1" in html
    assert "<svg" not in html and '<img src="data:image/svg+xml;base64,' in html  # survives a sanitiser
    # nbconvert: the runner's HTML shows the snapshot (self-contained: no widget state for a widget library to draw)
    page = (tmp_path / "out.html").read_text()
    assert STATE not in page and "snapshot at the end of In[5], not live</div>" in page and "In[3] running" not in page
    # so does nbconvert's HTML of the notebook as JupyterLab saves it (without widget state, its default)
    del out.metadata["widgets"]
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter().from_notebook_node(out)
    assert "snapshot at the end of In[5], not live</div>" in body and "In[3] running" not in body
