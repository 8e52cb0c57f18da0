"""The workbench's own views over the TorchNeuron stand-in, as on a Trn instance: a parity and a compare check, the
dashboard and tensor views with the allocator's real bytes, and ``neuron-lab run`` of a notebook whose report comes
back from the kernel. Reports, compile, profile, memory, OOM and ranks over the stand-in are in
test_extension_on_torchneuron.py, test_memory_reading.py, test_profile_on_torchneuron.py and test_checkup.py."""

from __future__ import annotations

import json

import nbformat
from fake_torchneuronx import BIN, SITE, run

VIEWS = r'''
import json
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
sh = InteractiveShell()
with capture_output():
    sh.run_line_magic("load_ext", "neuron_lab")
out = {}
def cell(name, code):
    with capture_output() as cap:
        res = sh.run_cell(code, store_history=True)
    out[name] = {"ok": res.success, "text": cap.stdout}
cell("setup", "import torch\ntorch.manual_seed(0)\nnet = torch.nn.Linear(8, 4).to('neuron')\n"
              "x = torch.randn(16, 8, device='neuron')")
cell("parity", "%%neuron parity --against cpu\ny = net(x).relu().sum()")
cell("compare", "%%neuron compare --runs 3\ny = net(x).relu().sum()")
cell("dashboard", "%neuron dashboard")
print(json.dumps(out))
'''


def test_the_checks_and_the_live_views_over_the_stand_in() -> None:
    out = run(VIEWS, site=SITE, timeout=300).json()
    assert all(c["ok"] for c in out.values()), out
    assert "aten::normal_" in out["setup"]["text"]  # randn has no kernel: the boxed fallback (the stand-in's table)
    parity = out["parity"]["text"]
    assert "parity neuron:0 vs cpu: agree (4 items)" in parity
    assert "float64 computed in float32 by the device" in parity  # the real device's 64-bit rule, said as such
    compare = out["compare"]["text"]
    assert "neuron_lab compare eager " in compare and " (min of 4): " in compare
    assert "check: " not in compare  # the result is the cell's Out; the report under it does not repeat it
    assert "host CPU" not in compare  # the emulator's timing note is its own: TorchNeuron's times are the device's
    dash = out["dashboard"]["text"]
    assert "device tensors: 5 storages, 916 B (memory_allocated 916 B)" in dash  # the nested stats' bytes, not 0
    assert "  In[1]          0 B →       656 B        +656 B  peak 656 B" in dash


def test_neuron_lab_run_over_the_stand_in_brings_the_kernels_reports_back(tmp_path) -> None:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import torch\nx = torch.ones(64, device='neuron')\ny = torch.atan2(x, x)")])
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    r = run(argv=[str(BIN / "neuron-lab"), "run", str(path), "--json", str(tmp_path / "run.json")], site=SITE,
            timeout=300)
    assert r.rc == 0, r.out + r.err
    doc = json.loads((tmp_path / "run.json").read_text())
    assert doc["backend"]["backend"] == "torchneuron" and doc["backend"]["coverage"] is None
    report = doc["cells"][0]["report"]
    assert [(o["op"], o["kind"], o["count"]) for o in report["ops_not_native"]] == [("aten::atan2", "fallback", 1)]
    assert report["memory"]["after"] >= 2 * 64 * 4  # x and y, read from the nested memory_stats in the kernel
