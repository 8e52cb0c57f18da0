"""The extension over the real-TorchNeuron adapter, against the fake ``torch_neuronx``.

The magics, session and report code never ask which backend runs; this shows the same cell
report (fallback counts and the cell line behind them) comes out of the adapter's observer.
Verified only against the fake in ``tests/fake_torchneuronx``, not on Trainium.
"""

from __future__ import annotations

from fake_torchneuronx import SITE, run

PROGRAM = """
import json
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
from neuron_lab.extension import session_of
sh = InteractiveShell()
with capture_output() as load:
    sh.run_line_magic("load_ext", "neuron_lab")
with capture_output() as cap:
    sh.run_cell("import torch\\nx = torch.ones(8, 2, device='neuron')", store_history=True)
    res = sh.run_cell("y = x + 1\\nfor _ in range(2):\\n    z = torch.atan2(x, y)", store_history=True)
r = session_of(sh).history[res.execution_count]
print(json.dumps({"banner": load.stdout, "out": cap.stdout, "backend": r.backend,
                  "rows": [[row.op, row.kind, row.count, [[s.site.cell, s.site.line, s.site.source, s.count]
                            for s in row.sites]] for row in r.fallbacks], "ops": r.ops, "cell": res.execution_count}))
"""


def test_the_cell_report_is_the_same_over_the_torchneuron_adapter():
    out = run(PROGRAM, site=SITE, timeout=180).json()
    assert out["banner"].startswith("neuron_lab 0.1.0: TorchNeuron 2.14.3.0 backend")
    n = out["cell"]
    assert out["rows"] == [["aten::atan2", "fallback", 2, [[n, 3, "z = torch.atan2(x, y)", 2]]]]
    assert out["ops"] >= 3  # add and two atan2, observed through the adapter's dispatch mode
    assert f"at In[{n}] line 3: z = torch.atan2(x, y)  (2×)" in out["out"]
