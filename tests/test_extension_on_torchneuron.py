"""The extension over the real-TorchNeuron adapter, against the fake ``torch_neuronx``.

The magics, session and report code never ask which backend runs; this shows the same cell
report (fallback counts and the cell line behind them) comes out of the adapter's observer.
Verified only against the fake in ``tests/fake_torchneuronx``, not on Trainium.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile

import pytest
from fake_torchneuronx import SITE, child_env, run

from neuron_lab.session import launch

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


# -- the runtime is the user's: nothing in neuron_lab starts it (tnx torch_neuronx/__init__.py:209-238) ------------
RUNTIME = """
import contextlib, io, json
import torch, torch_neuronx
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
from neuron_lab import cli
from neuron_lab.extension import session_of
from neuron_lab.session.session import Status, banner

def doctor():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = cli.main(["doctor"])
    return rc, next(line.strip() for line in out.getvalue().splitlines() if line.strip().startswith("devices"))

def seen():
    s = session_of(sh)
    return {"runtime": torch_neuronx.is_neuron_runtime_initialized(), "banner": banner(s),
            "status": next(line for line in Status(s).lines if line.startswith("memory:")), "doctor": doctor()}

sh = InteractiveShell()
with capture_output() as load:
    sh.run_line_magic("load_ext", "neuron_lab")
sh.run_cell("y = 1 + 1", store_history=True)  # a cell that never touches the device
out = {"loaded": load.stdout, "before": seen()}
with capture_output():
    sh.run_cell("import torch\\nx = torch.ones(8, device='neuron')", store_history=True)
out["after"] = seen()
print(json.dumps(out))
"""


def test_loading_the_extension_leaves_the_neuron_runtime_to_the_user():
    out = run(RUNTIME, site=SITE, timeout=180).json()
    before, after = out["before"], out["after"]
    assert before["runtime"] is False  # load, banner, a cell report, %neuron status and doctor started nothing
    assert " · capacity after first device use · mode default" in out["loaded"]
    assert before["banner"] == out["loaded"].strip()
    assert before["status"].endswith("capacity after first device use")
    assert before["doctor"] == [0, "devices      1 (neuron:0); capacity after first device use"]
    assert after["runtime"] is True  # the user's device tensor started it; now the device's own numbers show
    assert " · 24.00 GiB · mode default" in after["banner"]
    assert after["status"].endswith("capacity 24.00 GiB")
    assert after["doctor"] == [0, "devices      1 (neuron:0); capacity 24.00 GiB per device"]


HELD = """
import contextlib, io, json
import torch, torch_neuronx
from neuron_lab import cli
from neuron_lab.backend.torchneuron import TorchNeuronBackend
try:
    torch.ones(1, device="neuron")  # the user's first device use: the runtime cannot start
    first_use = "ok"
except RuntimeError as e:
    first_use = str(e)
out = {"first_use": first_use}
for name in ("lazy", "eager"):
    if name == "eager":  # fault injection: a capacity read that starts the runtime, as before this change
        TorchNeuronBackend.capacity = lambda self: int(torch.neuron.get_device_properties(0).total_memory)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = cli.main(["doctor"])
    out[name] = [rc, buf.getvalue()]
print(json.dumps(out))
"""


def test_doctor_with_a_neuron_runtime_held_elsewhere_says_so_and_finishes():
    out = run(HELD, site=SITE, env={"FAKE_NRT_HELD": "1"}).json()
    assert out["first_use"] == "Failed to initialize Neuron Runtime: status code 1"
    rc, text = out["lazy"]
    assert rc == 0 and "devices      1 (neuron:0); capacity after first device use" in text
    rc, text = out["eager"]
    assert rc == 0 and "Traceback" not in text
    assert ("devices      unknown: the Neuron runtime did not start (Failed to initialize Neuron Runtime: status code "
            "1); another process holds the NeuronCores (a notebook kernel or a training job): stop it, or give each "
            "process its own cores with NEURON_RT_VISIBLE_CORES") in text
    assert "  TorchNeuron settings" in text and "  problems     none" in text  # the rest of doctor still prints


# -- ranks load the extension before init_process_group, and pass TorchNeuron's check (backend.py:292-295) ---------
RANK = """
import json, sys
from datetime import timedelta
from IPython.core.interactiveshell import InteractiveShell
import torch.distributed as dist
import torch_neuronx
sh = InteractiveShell()
if sys.argv[1] == "ranks":  # a %neuron ranks engine
    from neuron_lab import agent
    joined = agent.join_ranks(sh, 120)
else:  # a `neuron-lab run --nproc` rank: the runner installs the extension, then the notebook's code joins
    from neuron_lab.runner import kernel
    kernel.install(sh)
    if sys.argv[1] == "device first":  # the stand-in's check is live: a device use before joining fails it
        import torch
        torch.ones(1, device="neuron")
    dist.init_process_group(backend="neuron", timeout=timedelta(seconds=120))
# a rank that left at once could close its gloo connection before a starved peer's connectFullMesh saw it made, and
# fail that peer ("Connection closed by peer", as in a loaded CI run): both leave after a collective, as scripts do
dist.barrier()
print(json.dumps({"rank": dist.get_rank(), "runtime": torch_neuronx.is_neuron_runtime_initialized()}))
dist.destroy_process_group()
"""


@pytest.mark.parametrize("launcher", ["ranks", "runner"])
def test_two_ranks_load_the_extension_then_init_process_group(launcher):
    procs, _store = _ranks(launcher)
    results = [p.communicate(timeout=180) for p in procs]
    for p, (_, err) in zip(procs, results):
        assert p.returncode == 0, err[-3000:]
        assert "Neuron runtime should not be initialized" not in err
    seen = [json.loads(out.strip().splitlines()[-1]) for out, _ in results]
    assert sorted(s["rank"] for s in seen) == [0, 1]
    assert all(s["runtime"] for s in seen)  # init_process_group started it, as TorchNeuron's does


def test_a_device_use_before_init_process_group_fails_torchneurons_check():
    procs, _ = _ranks("device first")
    errs = [p.communicate(timeout=180)[1] for p in procs]
    assert all(p.returncode != 0 for p in procs)
    assert any("AssertionError: Neuron runtime should not be initialized before the init_process_group." in e
               for e in errs), errs[0][-3000:]


def _ranks(launcher: str) -> tuple[list[subprocess.Popen], launch.AgentStore]:
    """Two ranks on one host, each running RANK with ``launcher``, as torchrun's agent, the runner and %neuron ranks
    start them: they meet at the rendezvous store hosted here (%neuron ranks engines' preflight meets there too),
    kept while it is held; the OS picks its port as it listens, so no other process can take it first."""
    store = launch.AgentStore()
    envs = [child_env({"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                       "MASTER_ADDR": store.address, "MASTER_PORT": str(store.port),
                       "TORCHELASTIC_USE_AGENT_STORE": "True"}, SITE) for r in range(2)]
    return [subprocess.Popen([sys.executable, "-c", RANK, launcher], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, cwd=tempfile.gettempdir(), env=env) for env in envs], store


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
