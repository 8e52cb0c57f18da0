"""The live views in a real kernel without a browser, as nbclient (and so ``neuron-lab run`` and CI) sees them.

nbclient keeps the widgets' last state in the notebook's metadata (``store_widget_state``), and applies
``update_display_data`` to the outputs it targets: so a saved notebook shows the dashboard's final data,
and the static view (``NeuronLab.display_as = 'static'``) shows the state after the last cell.
"""

from __future__ import annotations

import os
import re
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
    "%config NeuronLab.display_as = 'static'\n%neuron fallbacks",  # In[4]
    "w = torch.ones(10, device='neuron')\ny = torch.atan2(x, x)",  # In[5]: the fallback is line 2
    "%neuron compiles",  # In[6]: static too
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
    assert data["tensors"]["total"] == data["tensors"]["allocated"] == 400 + 40 + 400
    assert state["state"]["live"]["busy"] is False


def test_static_view_is_updated_in_place_after_each_cell(nb: Any) -> None:
    bundles = _bundles(nb.cells[3])
    assert len(bundles) == 1 and WIDGET not in bundles[0]
    text = bundles[0]["text/plain"]
    assert "aten::atan2.out" in text and "In[5] line 2: y = torch.atan2(x, x)" in text, text
    assert "aten::atan2.out" in bundles[0]["text/html"]


def test_reports_still_show_under_the_views(nb: Any) -> None:
    texts = [b.get("text/plain", "") for b in _bundles(nb.cells[4])]
    assert any(t.startswith("neuron_lab In[5] · neuron:0 · default · ") for t in texts), texts
