"""The device synchronisations the workbench adds per cell, counted (issue 31): on TorchNeuron each one ends an
Adaptive Eager fusion group and stalls the queue, so the workbench may add at most one a cell when nothing asks
for more.

A real in-process IPython shell runs the same training cell (a small MLP, AdamW, no ``.item()``: the user's own
code forces no sync) ``--cells`` times in each configuration: the extension not loaded, loaded, and loaded with
the dashboard open. Counted per cell: the backend's ``synchronize`` calls (the one a tracked cell makes to read
memory after it ran), the device-to-host reads of any origin (a raw subscriber to the backend's ``sync`` events:
the workbench's own reads would show here), and the syncs the cell's report lists as the user's. Counts, not
timings: the figures are the same on any machine.
"""

from __future__ import annotations

import argparse
import json

import figures  # bench/ is the script directory
import torch
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
from traitlets.config import Config

from neuron_lab import backend
from neuron_lab.kinds import SYNC

SETUP = """\
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to("neuron")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x, y = torch.randn(64, 32, device="neuron"), torch.randn(64, 1, device="neuron")
"""
STEP = """\
for _ in range(5):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
"""
CONFIGS = ("extension not loaded", "extension", "extension + dashboard")
TARGET = 1  # synchronize calls plus device-to-host reads the workbench may add a cell


def _shell() -> InteractiveShell:
    c = Config()
    c.HistoryAccessor.enabled = False
    return InteractiveShell(config=c)


def measure(config: str, cells: int) -> dict[str, float]:
    """Per-cell counts of one configuration, over ``cells`` runs of the training cell."""
    sh = _shell()
    with capture_output():
        if config != CONFIGS[0]:
            sh.run_line_magic("load_ext", "neuron_lab")
        sh.run_cell("import neuron_lab.backend.autoload" if config == CONFIGS[0] else "pass")
        sh.run_cell(SETUP)
        if config == CONFIGS[2]:
            sh.run_cell("panel = %neuron dashboard")
        sh.run_cell(STEP)  # warm: first-use work is not a cell's steady cost
    b = backend.active()
    reads = [0]
    unsubscribe = b.subscribe(lambda *_: reads.__setitem__(0, reads[0] + 1), frozenset({SYNC}))
    before = b.synchronizes
    user = 0
    try:
        with capture_output():
            for _ in range(cells):
                res = sh.run_cell(STEP, store_history=True)
                assert res.success, res.error_in_exec
                if config != CONFIGS[0]:
                    from neuron_lab.extension import session_of

                    user += session_of(sh).history[res.execution_count].sync_calls
    finally:
        unsubscribe()
        with capture_output():
            if config != CONFIGS[0]:
                sh.run_line_magic("unload_ext", "neuron_lab")
            sh.reset()
    return {"synchronizes": (b.synchronizes - before) / cells, "reads": reads[0] / cells, "user": user / cells}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, default=20)
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument("--figures", help="also write the syncs added per cell here (bench/table.py)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    rows = {c: measure(c, a.cells) for c in CONFIGS}
    print(f"{'configuration':<24} {'synchronize/cell':>17} {'d2h reads/cell':>15} {'user syncs/cell':>16}  "
          f"≤ {TARGET} added")
    for c, r in rows.items():
        added = r["synchronizes"] + r["reads"]
        print(f"{c:<24} {r['synchronizes']:>17.2f} {r['reads']:>15.2f} {r['user']:>16.2f}  "
              f"{'holds' if added <= TARGET else 'FAILS'}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"target": TARGET, "configurations": rows}, f, indent=1)
    figures.write(a.figures, [figures.figure(f"device syncs added per cell: {c}", [r["synchronizes"] + r["reads"]],
                                             "syncs", TARGET) for c, r in rows.items()])


if __name__ == "__main__":
    main()
