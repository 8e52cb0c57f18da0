"""Memory as the workbench reads it: TorchNeuron's nested ``memory_stats()``, for the notebook's device.

Over the stand-in (``tests/fake_torchneuronx``, nested as ``torch_neuronx/memory.py:28-54``) the cell report shows the
real before/after/peak bytes, ``%neuron status`` shows the allocator's counters and says once that each cell resets the
peak counter, and TorchNeuron's ``RuntimeError`` OOM gets the OOM report. On the emulator, a notebook on ``neuron:1``
reads ``neuron:1`` (it read device 0), and the user's own peak counter is left alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fake_torchneuronx import SITE, run
from shells import loaded_shell
from shells import run as run_cell

from neuron_lab import backend
from neuron_lab.backend.interface import NeuronBackend
from neuron_lab.backend.memory_reading import MemoryReading
from neuron_lab.extension import session_of
from neuron_lab.session import oom
from neuron_lab.units import format_size

STAND_IN = """
import json
import torch
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
from neuron_lab.extension import session_of
import torch_neuronx

sh = InteractiveShell()
with capture_output():
    sh.run_line_magic("load_ext", "neuron_lab")
s = session_of(sh)

def cell(code):
    with capture_output() as cap:
        res = sh.run_cell(code, store_history=True)
    return res, cap.stdout

cell("import torch\\nx = torch.ones(1024, device='neuron')")  # 4 KiB
res, _ = cell("y = torch.ones(2048, device='neuron')\\ntmp = torch.ones(4096, device='neuron')\\ndel tmp")
m = s.history[res.execution_count].memory
out = {"memory": [m.before, m.after, m.peak], "stats": torch.neuron.memory_stats(),
       "status": str(s.status())}
torch_neuronx._device.state().allocator.capacity = torch.neuron.memory_allocated() + 1000
res, text = cell("big = torch.empty(10**6, device='neuron')")
r = s.history[res.execution_count]
out.update(error=f"{type(res.error_in_exec).__name__}: {res.error_in_exec}", oom_allocated=r.oom.allocated,
           oom_held=[list(h.names) for h in r.oom.tensors], marks=[k.kind for k in s.timeline.marks()],
           report_error=r.error, ooms=str(s.status()).splitlines()[2], propagated_handled=len(r.ooms_handled))
res, _ = cell("try:\\n    big = torch.empty(10**6, device='neuron')\\nexcept RuntimeError:\\n    pass")
out.update(handled=str(s.history[res.execution_count]).splitlines())
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def stand_in():
    return run(STAND_IN, site=SITE, timeout=180).json()


def test_the_cell_report_reads_torchneurons_nested_stats(stand_in) -> None:
    before, after, peak = stand_in["memory"]
    assert (before, after, peak) == (4096, 4096 + 8192, 4096 + 8192 + 16384)  # not 0 B → 0 B
    stats = stand_in["stats"]
    assert stats["allocated_bytes"]["current"] == after
    assert set(stats) == {"allocated_bytes", "reserved_bytes", "active_bytes", "num_alloc_retries", "num_ooms",
                          "num_tensor_frees", "allocation_requests"}


def test_status_shows_the_allocators_counters_and_the_peak_reset_once(stand_in) -> None:
    lines = stand_in["status"].splitlines()
    assert lines[1] == "memory:  12.00 KiB allocated on neuron:0, peak 28.00 KiB, capacity 24.00 GiB"
    assert lines[2] == "         0 B reserved, 12.00 KiB active, allocation retries 0, OOMs 0"
    assert lines[3] == f"         {NeuronBackend.peak_note}"
    page = (Path(__file__).parents[1] / "docs" / "torchneuron.md").read_text()
    assert page.count(NeuronBackend.peak_note) == 1  # the same sentence, once, in the docs


def test_torchneurons_runtime_error_oom_gets_the_oom_report(stand_in) -> None:
    assert stand_in["error"] == "RuntimeError: NRT allocation failed for size 4000000 (OOM)"
    assert stand_in["report_error"] == stand_in["error"]
    assert stand_in["oom_allocated"] == 4096 + 8192 and ["y"] in stand_in["oom_held"] and ["x"] in stand_in["oom_held"]
    assert "oom" in stand_in["marks"]
    assert stand_in["ooms"].endswith("OOMs 1")
    assert stand_in["propagated_handled"] == 0  # the error the cell ended with is not a handled one


def test_a_handled_torchneuron_oom_is_counted_without_a_line(stand_in) -> None:
    """TorchNeuron's RuntimeError cannot be watched as it is raised: its allocator's num_ooms tells of it."""
    assert "1 out-of-memory error handled (the device does not say where)" in stand_in["handled"], stand_in["handled"]


def test_the_oom_predicate_knows_both_errors() -> None:
    assert oom.is_oom(torch.OutOfMemoryError("neuron:0 out of memory (emulated)"))
    assert oom.is_oom(RuntimeError("NRT allocation failed for size 4096 (OOM)"))
    assert not oom.is_oom(RuntimeError("NRT allocation failed for size 4096"))  # not NRT_RESOURCE: no "(OOM)"
    assert not oom.is_oom(ValueError("NRT allocation failed for size 4096 (OOM)")) and not oom.is_oom(None)
    # code written for TorchNeuron catches RuntimeError; the emulator's OOM is one
    assert issubclass(torch.OutOfMemoryError, RuntimeError)


def test_a_reading_parses_the_nested_shape() -> None:
    stats = {"allocated_bytes": {"current": 5, "peak": 9, "allocated": 20, "freed": 15},
             "reserved_bytes": {"current": 8, "peak": 8, "allocated": 8, "freed": 0},
             "active_bytes": {"current": 4, "peak": 9, "allocated": 20, "freed": 16},
             "num_alloc_retries": 2, "num_ooms": 1, "num_tensor_frees": 3, "allocation_requests": 4}
    assert MemoryReading.parse(stats) == MemoryReading(5, 9, 8, 4, 2, 1)
    assert MemoryReading.parse({}) == MemoryReading(0, 0, 0, 0, 0, 0)


# -- the emulator ---------------------------------------------------------------------------------
needs_devices = pytest.mark.skipif(torch.neuron.device_count() < 2, reason="one device on the pure-Python core")


@needs_devices
def test_a_notebook_on_neuron_1_reads_neuron_1() -> None:
    with loaded_shell() as sh:
        run_cell(sh, "%neuron device neuron:1")
        run_cell(sh, "import torch\nkeep0 = torch.ones(256, device='neuron:0')")  # 1 KiB on the current device
        res, cap = run_cell(sh, "a = torch.ones(1024, device=device)\nt = torch.ones(4096, device=device)\ndel t")
        r = session_of(sh).history[res.execution_count]
        assert (r.memory.before, r.memory.after, r.memory.peak) == (0, 4096, 4096 + 16384)
        assert "memory: 0 B → 4.00 KiB (+4.00 KiB), peak 20.00 KiB" in cap.stdout
        _, cap = run_cell(sh, "%neuron status")
        assert "memory:  4.00 KiB allocated on neuron:1, peak 20.00 KiB" in cap.stdout
        _, cap = run_cell(sh, "%neuron tensors")
        everywhere = sum(torch.neuron.memory_allocated(i) for i in range(torch.neuron.device_count()))
        assert everywhere >= 5 * 1024  # this test's 5 KiB, and whatever earlier tests of this process left
        assert f"(memory_allocated {format_size(everywhere)})" in cap.stdout  # every device's storages and bytes


def test_the_emulator_leaves_the_users_peak_counter_alone() -> None:
    with loaded_shell() as sh:
        run_cell(sh, "import torch\ntorch.neuron.reset_peak_memory_stats()\nbase = torch.neuron.memory_allocated()\n"
                     "t = torch.ones(8192, device='neuron')\ndel t")
        run_cell(sh, "u = torch.ones(16, device='neuron')")
        res, _ = run_cell(sh, "torch.neuron.max_memory_allocated() - base")
        assert res.result == 32768  # the first cell's peak, three cells later
        assert backend.active().peak_note is None
        _, cap = run_cell(sh, "%neuron status")
        assert "resets the device's peak counter" not in cap.stdout
