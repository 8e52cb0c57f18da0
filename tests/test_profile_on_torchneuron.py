"""``%%neuron profile`` over the TorchNeuron adapter, against the stand-in's profiler hook.

TorchNeuron's Kineto plugin gives torch.profiler no device events and has NRT write its files into the
``profile_output_dir`` of ``custom_profiler_config`` (tnx:torch_neuronx/csrc/profiler/Session.cpp:65-75,249-257).
The report names that folder and its files, shows host time only and says why in one line; ``--export`` still
writes the host trace. Verified only against ``tests/fake_torchneuronx``, not on Trainium.
"""

from __future__ import annotations

from fake_torchneuronx import SITE, run

from neuron_lab.backend.torchneuron import NO_DEVICE_TIMING

PROGRAM = """
import json, os, tempfile
os.chdir(tempfile.mkdtemp())
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
from neuron_lab.extension import session_of
sh = InteractiveShell()
with capture_output():
    sh.run_line_magic("load_ext", "neuron_lab")
with capture_output() as cap:
    sh.run_cell("import torch\\nx = torch.ones(8, 2, device='neuron')", store_history=True)
    exported = sh.run_cell("%%neuron profile --export trace.json\\ny = torch.atan2(x, x + 1)", store_history=True)
    plain = sh.run_cell("%%neuron profile\\ny = x * 2", store_history=True)
def facts(res):
    p = session_of(sh).history[res.execution_count].profiled
    return {"dir": p.artefacts_dir, "files": p.artefacts, "device_timing": p.device_timing, "lanes": p.lanes,
            "cell": res.execution_count}
print(json.dumps({"out": cap.stdout, "cwd": os.getcwd(), "trace": os.path.getsize("trace.json"),
                  "exported": facts(exported), "plain": facts(plain)}))
"""


def test_a_profiled_cell_names_the_nrt_files_and_shows_host_time_only():
    out = run(PROGRAM, site=SITE, timeout=240).json()
    plain, exported = out["plain"], out["exported"]
    assert plain["dir"] == f"{out['cwd']}/neuron_profile/cell-1"
    assert exported["dir"] == f"{out['cwd']}/trace-neuron-1"  # next to the --export path
    kinds = sorted(f.rsplit("/", 1)[-1].rsplit(".", 1)[-1] for f in plain["files"])
    assert kinds == ["neff", "ntff", "pb", "pb", "pb"]
    assert all(f.split("/")[0].endswith(f"_pid_{f.split('_pid_')[1].split('/')[0]}") for f in plain["files"])
    assert plain["device_timing"] is False and plain["lanes"] == {}
    text = out["out"]
    assert text.count(NO_DEVICE_TIMING) == 2
    assert f"neuron-explorer view -d {plain['dir']}" in text
    assert "  device trace: " in text and "  system trace: " in text
    assert "ops by host time:" in text and "device + host" not in text
    assert "op           ran           calls  host" in text  # no device column
    assert "profiled: host " in text and "profiled: device" not in text
    assert "device lanes:" not in text
    assert out["trace"] > 0  # --export still writes the host trace
