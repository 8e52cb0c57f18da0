"""The dashboard in a real JupyterLab in Chromium: it renders, its memory value moves while the training
cell is still running, and the CPU-fallback inspector lists the known op with its cell and line.

The screenshot it saves (``out/test-artifacts/dashboard-*.png``) is the one in the README; with
``NEURON_LAB_UPDATE_SCREENSHOTS=1`` it is also copied to ``docs/``.
"""

from __future__ import annotations

import os
import shutil

from browser import (
    JS_CELL_RUNNING,
    ROOT,
    cell_locator,
    open_notebook,
    run_all,
    screenshot,
    wait_for,
    wait_idle,
)

pytest_plugins = ["browser"]

TRAIN_CELL = 3  # 0-based; it runs as In[4]
CELLS = [
    "%load_ext neuron_lab",
    "import time\nimport torch\n"
    "model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64)).to('neuron')\n"
    "opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
    "x = torch.randn(32, 64).to('neuron')",
    "%neuron dashboard",
    # In[4]: the fallback is line 4; ~6 s of training that keeps 16 KiB more device memory per step
    "keep = []\n"
    "for step in range(30):\n"
    "    opt.zero_grad()\n"
    "    loss = torch.atan2(model(x), x).pow(2).mean()\n"
    "    loss.backward()\n"
    "    opt.step()\n"
    "    keep.append(torch.ones(4096, device='neuron'))\n"
    "    time.sleep(0.2)",
    "print('trained', len(keep))",
]

# The memory value and whether the training cell runs, read in one JS turn so both describe one instant.
ALLOCATED_WHILE_TRAINING = f"""([cell, other]) => {{
    const b = document.querySelector('.jp-Notebook [data-testid=nl-mem-allocated]');
    const text = b ? b.textContent : null;
    return ({JS_CELL_RUNNING})(cell) && text && text !== other ? text : null;
}}"""


def test_dashboard_updates_live_and_inspects_fallbacks(jupyter_lab, lab_page):
    page = lab_page
    open_notebook(page, jupyter_lab, "dashboard.ipynb", CELLS)
    run_all(page)

    # the dashboard renders, as tabs, with the memory view first
    panel = cell_locator(page, 2).locator("[data-testid=nl-panel]")
    panel.wait_for(state="visible", timeout=60_000)
    assert [t.strip() for t in panel.locator(".nl-tab").all_inner_texts()] == [
        "Memory", "Tensors", "CPU fallbacks", "Compiles"]

    # the memory value changes while the training cell is still running
    first = wait_for(page, ALLOCATED_WHILE_TRAINING, timeout=60, arg=[TRAIN_CELL, ""])
    second = wait_for(page, ALLOCATED_WHILE_TRAINING, timeout=10, arg=[TRAIN_CELL, first])
    third = wait_for(page, ALLOCATED_WHILE_TRAINING, timeout=10, arg=[TRAIN_CELL, second])
    assert len({first, second, third}) == 3, (first, second, third)
    status = panel.locator("[data-testid=nl-status]").inner_text()
    assert status.startswith("In[4] running"), status
    screenshot(page, "dashboard-live")

    wait_idle(page, timeout=60)
    # the inspector: the known op, its count, and its cell, line and source
    panel.locator(".nl-tab[data-view=fallbacks]").click()
    row = panel.locator("[data-testid=nl-fallback-row][data-op='aten::atan2.out']")
    row.wait_for(state="visible", timeout=10_000)
    assert "30×" in row.locator("summary").inner_text()
    row.locator("summary").click()
    site = row.locator("[data-testid=nl-site]").first
    cells = [c.strip() for c in site.locator("td").all_inner_texts()]
    assert cells == ["In[4]", "line 4", "loss = torch.atan2(model(x), x).pow(2).mean()", "30×"], cells
    assert panel.locator("[data-testid=nl-profile]").inner_text() == "torchneuron-2.33"
    shot = panel.screenshot(path=str(ROOT / "out" / "test-artifacts" / "dashboard-fallbacks.png"))
    assert shot
    # the expanded row stays open across the next update (UI state lives in the browser)
    panel.locator(".nl-tab[data-view=memory]").click()
    assert panel.locator("[data-testid=nl-free]").is_visible()
    shot = panel.screenshot(path=str(ROOT / "out" / "test-artifacts" / "dashboard-memory.png"))
    assert shot
    panel.locator(".nl-tab[data-view=fallbacks]").click()
    assert row.get_attribute("open") is not None

    if os.environ.get("NEURON_LAB_UPDATE_SCREENSHOTS") == "1":
        (ROOT / "docs").mkdir(exist_ok=True)
        for name in ("dashboard-fallbacks", "dashboard-memory"):
            shutil.copy(ROOT / "out" / "test-artifacts" / f"{name}.png", ROOT / "docs" / f"{name}.png")
