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


ACCOUNT = """
import json
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
from neuron_lab.extension import session_of
sh = InteractiveShell()
with capture_output():
    sh.run_line_magic("load_ext", "neuron_lab")
cells = {
    "complex": "import torch\\nc = torch.ones(4, dtype=torch.complex64, device='neuron')\\nd = c + c\\ne = c.real + 1",
    "host": "m = torch.randn(4, 4, device='neuron')\\nq, r = torch.linalg.qr(m)",
    "compile": "f = torch.compile(lambda p: p.sin() * 2, backend='neuron')\\ny = f(m)",
    "cached": "g = torch.compile(lambda p: p.sin() * 2, backend='neuron')\\ny = g(m)",
    "eager": ("import torch_neuronx.neuron_dynamo_backend as nb\\nnb.FAIL_EXECUTION = True\\n"
              "h = torch.compile(lambda p: p.cos() + 1, backend='neuron')\\ny = h(m)\\nnb.FAIL_EXECUTION = False"),
}
out = {}
for name, code in cells.items():
    with capture_output() as cap:
        res = sh.run_cell(code, store_history=True)
    r = session_of(sh).history[res.execution_count]
    out[name] = {"text": cap.stdout, "cell": res.execution_count, "error": r.error,
                 "rows": [[row.op, row.kind, row.count, [[s.site.line, s.site.source] for s in row.sites],
                           row.reason] for row in r.ops_not_native],
                 "neff_s": r.compiles.neff_compile_s, "cache": r.compiles.neff_cache, "failures": r.compiles.failures}
print(json.dumps(out))
"""


def test_the_cell_report_reconciles_with_torchneurons_own_account():
    """A registered op TorchNeuron ran on the CPU (complex add: tnx python_ops/base.py:806-829) is a fallback row at
    its line, a host kernel (linalg_qr: cpu_fallback_registrations.py:54-73) a host row; neuronx-cc time and the
    NEFF cache are in the compile line; a graph run eagerly after a failure is said."""
    out = run(ACCOUNT, site=SITE, env={"TORCH_NEURONX_METRICS_ENABLED": "1"}, timeout=240).json()
    rows = {r[0]: r for r in out["complex"]["rows"]}
    assert rows["aten::add.Tensor"][1:4] == ["fallback", 2, [[3, "d = c + c"], [4, "e = c.real + 1"]]]
    assert "TorchNeuron reported this op as run on the CPU" in rows["aten::add.Tensor"][4]
    assert "d = c + c" in out["complex"]["text"]
    host = {r[0]: r for r in out["host"]["rows"]}
    assert host["aten::linalg_qr"][1:4] == ["host", 1, [[2, "q, r = torch.linalg.qr(m)"]]]
    assert "cpu_fallback_registrations.py" in host["aten::linalg_qr"][4]
    assert out["compile"]["neff_s"] == 0.25 and out["compile"]["cache"] == [0, 1]
    assert "250.0 ms NEFF compile (NEFF cache: 0 hits, 1 miss)" in out["compile"]["text"]
    assert out["cached"]["neff_s"] == 0 and out["cached"]["cache"] == [1, 0]  # found in the cache: nothing compiled
    assert "NEFF cache: 1 hit, 0 misses" in out["cached"]["text"]
    assert out["eager"]["error"] is None
    assert any("ran eagerly" in f and "NEFF execution failed (fake)" in f for f in out["eager"]["failures"])
    assert "ran eagerly" in out["eager"]["text"]
