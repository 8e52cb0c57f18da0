"""torch.profiler on the emulated device (issue 19's foundation): the compiled core serves PyTorch's PrivateUse1
profiler hooks, so a profile with ``ProfilerActivity.PrivateUse1`` has device kernels on a lane per `neuron:i`,
CPU fallbacks as host work, copies as memcpys, device time in ``key_averages()``, and no rows for the host
kernels the emulator computes with. Asserted on the exported Chrome trace and the profiler's own tables."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import core
from torch.profiler import ProfilerActivity, profile

import neuron_lab  # noqa: F401
from neuron_lab.backend.emulator import runtime

pytestmark = pytest.mark.skipif(core() != "compiled", reason="the profiler hooks are the compiled core's (C++ only)")
DEVICE = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]


def _operands(device: str = "neuron") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    a, b, c = (torch.randn(32, 32, device=device), torch.randn(32, 32, device=device), torch.randn(32, device=device))
    torch.addmm(c, a, b)  # warm: the first call classifies the op
    return a, b, c


def _trace(prof: Any, tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    return json.loads(path.read_text())["traceEvents"]


def _complete(events: list[dict[str, Any]], cat: str) -> list[dict[str, Any]]:
    return [e for e in events if e.get("ph") == "X" and e.get("cat") == cat]


def _process_names(events: list[dict[str, Any]]) -> dict[int, str]:
    return {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}


def test_the_core_serves_both_privateuse1_profiler_hooks() -> None:
    assert runtime.get().core == "compiled"
    from neuron_lab.backend.emulator import _core

    assert _core.profiler_registered() is True


def test_a_native_op_is_a_kernel_on_its_device_lane_linked_to_its_cpu_op(tmp_path: Path) -> None:
    a, b, c = _operands()
    with profile(activities=DEVICE) as prof:
        torch.addmm(c, a, b)
    events = _trace(prof, tmp_path)
    (kernel,) = _complete(events, "kernel")
    assert kernel["name"] == "aten::addmm" and kernel["pid"] == 0 and kernel["tid"] == 0
    assert kernel["args"]["device"] == "neuron:0" and kernel["args"]["kind"] == "native" and kernel["dur"] > 0
    assert _process_names(events)[0] == "neuron:0"
    (op,) = _complete(events, "cpu_op")
    assert op["name"] == "aten::addmm" and op["pid"] == os.getpid()
    assert op["args"]["External id"] == kernel["args"]["External id"]  # the kernel is this op's
    assert op["ts"] <= kernel["ts"] and kernel["ts"] + kernel["dur"] <= op["ts"] + op["dur"] + 1


def test_each_cycle_of_a_schedule_has_the_kernels_of_its_steps_backward_included(tmp_path: Path) -> None:
    x = torch.randn(16, 16, device="neuron", requires_grad=True)
    w = torch.randn(16, 16, device="neuron")
    cycles: list[list[tuple[str, int]]] = []

    def ready(prof: Any) -> None:
        events = _trace(prof, tmp_path)
        ops = {e["args"]["External id"]: e for e in _complete(events, "cpu_op")}
        # every kernel belongs to a CPU op: the thread that ran it is that op's (autograd's for the backward)
        cycles.append(sorted((k["name"], ops[k["args"]["External id"]]["tid"]) for k in _complete(events, "kernel")))

    with profile(activities=DEVICE, schedule=torch.profiler.schedule(wait=1, warmup=1, active=1, repeat=2),
                 on_trace_ready=ready, acc_events=True) as prof:
        for _ in range(6):
            x.mm(w).sum().backward()
            prof.step()
    assert len(cycles) == 2 and cycles[0] == cycles[1]
    names = [name for name, _ in cycles[0]]
    assert names.count("aten::mm") == 2 and "aten::sum" in names  # forward mm, backward mm (grad of x)
    # the main thread and autograd's device thread: while a trace records, backward runs where TorchNeuron runs it
    assert len({tid for _, tid in cycles[0]}) == 2
    assert not torch._C._is_multithreading_enabled()  # and off the profiler on the calling thread again


def test_key_averages_have_device_time_for_native_ops() -> None:
    a, b, c = _operands()
    with profile(activities=DEVICE) as prof:
        torch.addmm(c, a, b).relu()
    rows = {(r.key, r.device_type): r for r in prof.key_averages()}
    addmm = rows[("aten::addmm", torch.autograd.DeviceType.CPU)]
    kernel = rows[("aten::addmm", torch.autograd.DeviceType.PrivateUse1)]
    assert addmm.count == 1 and addmm.device_time_total > 0 and addmm.self_device_time_total > 0
    assert kernel.count == 1 and kernel.self_device_time_total == addmm.self_device_time_total
    table = prof.key_averages().table()
    assert "Self NEURON" in table and "Self NEURON time total" in table
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.PrivateUse1]
    assert [e.name for e in kernels] == ["aten::addmm", "aten::relu"]


def test_a_cpu_fallback_is_host_work_on_the_calling_thread(tmp_path: Path) -> None:
    a, _, _ = _operands()
    torch.atan2(a, a)  # a CPU fallback in TorchNeuron's coverage profile
    with profile(activities=DEVICE) as prof:
        torch.atan2(a, a)
    events = _trace(prof, tmp_path)
    assert [e["name"] for e in _complete(events, "kernel")] == []  # nothing ran on the device
    (host,) = _complete(events, "privateuse1_runtime")
    assert host["name"] == "CPU fallback: aten::atan2" and host["pid"] == os.getpid()
    assert host["args"]["kind"] == "fallback" and host["args"]["device"] == "neuron:0"
    ops = {e["args"]["External id"]: e for e in _complete(events, "cpu_op")}
    assert ops[host["args"]["External id"]]["name"] == "aten::atan2"
    device_time = {r.key: r.device_time_total for r in prof.key_averages()
                   if r.device_type == torch.autograd.DeviceType.CPU}
    assert device_time["aten::atan2"] == 0


def test_host_kernels_of_device_ops_are_not_profiled_as_ops() -> None:
    a, b, c = _operands()
    for activities in ([ProfilerActivity.CPU], DEVICE):
        with profile(activities=activities) as prof:
            torch.addmm(c, a, b)
        cpu = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CPU]
        assert cpu == ["aten::addmm"]  # not its CPU kernel's expand / copy_ / resolve_conj


def test_copies_are_memcpys_on_the_device_lane(tmp_path: Path) -> None:
    host = torch.ones(4, 4)
    host.to("neuron")
    with profile(activities=DEVICE) as prof:
        d = host.to("neuron")
        d.sum().item()
    copies = _complete(_trace(prof, tmp_path), "gpu_memcpy")
    assert [(e["name"], e["args"]["bytes"], e["pid"]) for e in copies] == [
        ("Memcpy HtoD (host -> neuron)", 64, 0), ("Memcpy DtoH (neuron -> host)", 4, 0)]


def test_nothing_is_recorded_when_the_device_is_not_profiled(tmp_path: Path) -> None:
    a, b, c = _operands()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.addmm(c, a, b)
    events = _trace(prof, tmp_path)
    assert _complete(events, "kernel") == [] and _complete(events, "privateuse1_runtime") == []


def _child(code: str, env: dict[str, str]) -> tuple[Any, str]:
    """Run ``code`` in a fresh interpreter; the JSON it prints last, and its stderr."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"child failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_two_devices_are_two_lanes(tmp_path: Path) -> None:
    out, _ = _child(f"""
        import json, torch, neuron_lab
        from torch.profiler import profile, ProfilerActivity
        x, y = torch.ones(8, 8, device="neuron:0"), torch.ones(8, 8, device="neuron:1")
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
            x.mm(x)
            y.mm(y)
        prof.export_chrome_trace({str(tmp_path / 'two.json')!r})
        print(json.dumps(torch.neuron.device_count()))
    """, {"NEURON_RT_NUM_CORES": "2", "NEURON_LAB_CORE": "compiled"})
    assert out == 2
    events = json.loads((tmp_path / "two.json").read_text())["traceEvents"]
    kernels = _complete(events, "kernel")
    assert sorted((e["name"], e["pid"], e["args"]["device"]) for e in kernels) == [
        ("aten::mm", 0, "neuron:0"), ("aten::mm", 1, "neuron:1")]
    names = _process_names(events)
    assert (names[0], names[1]) == ("neuron:0", "neuron:1")


def test_a_fallbacks_result_is_the_devices_memory_only_and_its_free_draws_no_warning() -> None:
    """A CPU kernel's result the core adopts as device memory leaves the CPU's accounting when it is adopted, as
    TorchNeuron frees a fallback's CPU result once it is on the device: counted once, as the device's. Freed in a
    memory profile after being made before it, it drew torch's "Memory block of unknown size" warning (a process's
    first such free warns, so a process of its own)."""
    out, err = _child("""
        import json, torch, neuron_lab
        from torch.profiler import profile, ProfilerActivity
        x = torch.randn(64, 64, device="neuron")
        before = x.nonzero()  # the boxed fallback's CPU result, adopted
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            del before
            y = x.nonzero()
        (row,) = [r for r in prof.key_averages() if r.key == "aten::nonzero"]
        print(json.dumps([row.self_device_memory_usage, row.self_cpu_memory_usage, y.nbytes]))
    """, {"NEURON_LAB_CORE": "compiled"})
    assert out == [out[2], 0, out[2]] and out[2] > 0
    assert "unknown size" not in err


def test_the_legacy_use_device_profiler_has_device_time_and_no_errors() -> None:
    out, err = _child("""
        import json, torch, neuron_lab
        a = torch.randn(32, 32, device="neuron")
        a.mm(a)
        with torch.autograd.profiler.profile(use_device="neuron") as prof:
            a.mm(a)
            torch.atan2(a, a)
        print(json.dumps({e.key: e.device_time_total for e in prof.key_averages()}))
    """, {"NEURON_LAB_CORE": "compiled"})
    assert out["aten::mm"] > 0 and out["aten::atan2"] == 0
    assert "not enabled" not in err and "INTERNAL ASSERT" not in err


def test_profile_memory_counts_device_bytes_as_the_devices_once(tmp_path: Path) -> None:
    """As CUDA's allocator does: each allocation and free is a `[memory]` event of the device, with its totals;
    the host bytes behind a fresh device tensor are not also counted as CPU memory."""
    torch.empty(1, device="neuron")  # warm
    with profile(activities=DEVICE, profile_memory=True) as prof:
        x = torch.empty(1000, 4, device="neuron")
        del x
    (row,) = [r for r in prof.key_averages() if r.key == "aten::empty"]
    assert (row.self_device_memory_usage, row.self_cpu_memory_usage) == (16000, 0)
    memory = [e for e in _trace(prof, tmp_path) if e.get("name") == "[memory]"]
    assert [(e["args"]["Device Type"], e["args"]["Device Id"], e["args"]["Bytes"]) for e in memory] == [
        (20, 0, 16000), (20, 0, -16000)]  # 20: PrivateUse1
    assert memory[0]["args"]["Total Allocated"] - memory[1]["args"]["Total Allocated"] == 16000
