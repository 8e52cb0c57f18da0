"""``torch_neuronx.profiling`` on the emulator (issue 19): TorchNeuron's documented usage, ``torch.profiler`` with
``experimental_config=NeuronConfig(...)`` and ``on_trace_ready=NeuronProfiler(cfg).export_trace``, writes a
Chrome/Perfetto trace per profiling cycle into ``profile_output_dir``, keeping the lanes of the devices
``capture_enabled_for_nc`` names. Traces are asserted by content; several devices and the pure-Python core need
processes of their own (``run_python``)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import core
from torch.profiler import ProfilerActivity, profile, schedule

import neuron_lab  # noqa: F401  (installs the backend, and `torch_neuronx` with it)

DEVICE = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]
compiled_only = pytest.mark.skipif(core() != "compiled", reason="device lanes are the compiled core's (C++ only)")
NOT_PRODUCED = ("neuron_lab's emulator writes a Chrome/Perfetto trace (neuron_trace_rank*_*.json) into "
                "profile_output_dir; it does not produce Neuron Explorer's .neff/.ntff (DEVICE), "
                "trace_info.pb/ntrace.pb (RUNTIME)")


def _events(path: Path) -> list[dict[str, Any]]:
    return json.loads(path.read_text())["traceEvents"]


def _complete(events: list[dict[str, Any]], cat: str) -> list[tuple[str, Any]]:
    return sorted((e["name"], e["pid"]) for e in events if e.get("ph") == "X" and e.get("cat") == cat)


def _lanes(events: list[dict[str, Any]]) -> dict[int, str]:
    return {e["pid"]: e["args"]["name"] for e in events
            if e.get("ph") == "M" and e.get("name") == "process_name" and e["args"]["name"].startswith("neuron:")}


def test_the_names_are_torchneurons_and_the_config_is_a_profiler_experimental_config() -> None:
    import torch_neuronx
    from torch_neuronx.profiling import NeuronConfig, NeuronProfiler, ProfileMode

    assert torch_neuronx.NeuronProfiler is NeuronProfiler
    assert [m.name for m in ProfileMode] == ["DEVICE", "RUNTIME", "CPU_UTIL", "HOST_MEMORY"]
    cfg = NeuronConfig(modes=[ProfileMode.RUNTIME, ProfileMode.HOST_MEMORY], max_events_per_nc=1000,
                       capture_enabled_for_nc="0,2-3", profile_output_dir="prof")
    assert isinstance(cfg, torch._C._profiler._ExperimentalConfig)
    assert cfg.custom_profiler_config == ("max_events_per_nc:1000;capture_enabled_for_nc:0,2-3;host_memory:true;"
                                          "profile_output_dir:prof")
    assert cfg.cores == frozenset({0, 2, 3}) and cfg.modes == (ProfileMode.RUNTIME, ProfileMode.HOST_MEMORY)
    default = NeuronConfig()
    assert (default.modes, default.profile_output_dir, default.cores) == (
        (ProfileMode.DEVICE, ProfileMode.RUNTIME), "./output", None)
    assert NeuronProfiler().config.modes == default.modes


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"capture_enabled_for_nc": "0,x"},
     "capture_enabled_for_nc: 'x' in '0,x' is neither a core index nor a range like '2-5'"),
    ({"capture_enabled_for_nc": "5-2"}, "capture_enabled_for_nc: range '5-2' in '5-2' runs backwards"),
    ({"capture_enabled_for_nc": ""},
     "capture_enabled_for_nc must be a string of core indices and ranges such as '0,1,2-5', got ''"),
    ({"capture_enabled_for_nc": [0, 1]},
     "capture_enabled_for_nc must be a string of core indices and ranges such as '0,1,2-5', got [0, 1]"),
    ({"modes": ["device"]}, "NeuronConfig modes must be a non-empty list of ProfileMode members (ProfileMode.DEVICE, "
                            "ProfileMode.RUNTIME, ProfileMode.CPU_UTIL, ProfileMode.HOST_MEMORY), got ['device']"),
    ({"modes": []}, "NeuronConfig modes must be a non-empty list of ProfileMode members (ProfileMode.DEVICE, "
                    "ProfileMode.RUNTIME, ProfileMode.CPU_UTIL, ProfileMode.HOST_MEMORY), got []"),
    ({"max_events_per_nc": 0}, "NeuronConfig max_events_per_nc must be a positive int, got 0"),
    ({"profile_output_dir": ""}, "NeuronConfig profile_output_dir must be a non-empty path (str or os.PathLike), "
                                 "got ''"),
    ({"precache_node_info": "yes"}, "NeuronConfig precache_node_info must be a bool, got 'yes'"),
])
def test_bad_arguments_say_what_is_wrong(kwargs: dict[str, Any], error: str) -> None:
    from torch_neuronx.profiling import NeuronConfig

    with pytest.raises((ValueError, TypeError)) as info:
        NeuronConfig(**kwargs)
    assert str(info.value) == error


def test_the_profiler_takes_only_a_neuron_config() -> None:
    from torch_neuronx.profiling import NeuronProfiler

    with pytest.raises(TypeError) as info:
        NeuronProfiler({"profile_output_dir": "x"})
    assert str(info.value) == "NeuronProfiler takes a torch_neuronx.profiling.NeuronConfig, got dict"


@compiled_only
def test_the_documented_usage_writes_a_trace_per_cycle_with_the_device_lane(tmp_path: Path) -> None:
    from torch_neuronx.profiling import NeuronConfig, NeuronProfiler, ProfileMode

    out = tmp_path / "profiles" / "run"  # created by the first export
    cfg = NeuronConfig(modes=[ProfileMode.DEVICE, ProfileMode.RUNTIME], profile_output_dir=str(out))
    a, b, c = (torch.randn(16, 16, device="neuron"), torch.randn(16, 16, device="neuron"),
               torch.randn(16, device="neuron"))
    torch.addmm(c, a, b)  # warm: the first call classifies each op
    torch.atan2(a, b)
    with pytest.warns(UserWarning) as caught, profile(
            activities=DEVICE, experimental_config=cfg, schedule=schedule(wait=1, warmup=1, active=1, repeat=2),
            on_trace_ready=NeuronProfiler(cfg).export_trace) as prof:
        for _ in range(6):
            torch.addmm(c, a, b)
            torch.atan2(a, b)  # a CPU fallback in TorchNeuron's coverage profile
            prof.step()
    assert sorted(p.name for p in out.iterdir()) == ["neuron_trace_rank0_0.json", "neuron_trace_rank0_1.json"]
    for path in sorted(out.iterdir()):
        events = _events(path)
        assert _complete(events, "kernel") == [("aten::addmm", 0)] and _lanes(events) == {0: "neuron:0"}
        assert _complete(events, "privateuse1_runtime") == [("CPU fallback: aten::atan2", os.getpid())]
        assert json.loads(path.read_text())["neuron_lab"] == {
            "emulated": True, "rank": 0, "modes": ["DEVICE", "RUNTIME"], "capture_enabled_for_nc": None}
    assert NOT_PRODUCED in [str(w.message) for w in caught]

    with pytest.warns(UserWarning, match="Neuron Explorer"), profile(
            activities=DEVICE, experimental_config=cfg, on_trace_ready=NeuronProfiler(cfg).export_trace):
        torch.addmm(c, a, b)
    assert sorted(p.name for p in out.iterdir())[-1] == "neuron_trace_rank0_2.json"  # a later profile adds a file


def test_capture_enabled_for_nc_keeps_only_those_devices_lanes(run_python, tmp_path: Path) -> None:
    if core() != "compiled":
        pytest.skip("device lanes are the compiled core's (C++ only)")
    out = run_python(f"""
        import json, warnings, torch, neuron_lab
        from torch.profiler import profile, ProfilerActivity
        from torch_neuronx.profiling import NeuronConfig, NeuronProfiler
        warnings.simplefilter("ignore")
        x, y = torch.ones(8, 8, device="neuron:0"), torch.ones(8, 8, device="neuron:1")
        x.mm(x), y.mm(y), torch.atan2(x, x)
        for name, spec in (("all", None), ("one", "1")):
            cfg = NeuronConfig(capture_enabled_for_nc=spec, profile_output_dir={str(tmp_path)!r} + "/" + name)
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], experimental_config=cfg,
                         on_trace_ready=NeuronProfiler(cfg).export_trace):
                x.mm(x)
                y.mm(y)
                torch.atan2(x, x)
        print(json.dumps(torch.neuron.device_count()))
    """, {"NEURON_RT_NUM_CORES": "2", "NEURON_LAB_CORE": "compiled", "RANK": "3"}, timeout=180)
    assert out == 2
    everything = _events(tmp_path / "all" / "neuron_trace_rank3_0.json")  # RANK names the file, as torchrun sets it
    assert _complete(everything, "kernel") == [("aten::mm", 0), ("aten::mm", 1)]
    assert _lanes(everything) == {0: "neuron:0", 1: "neuron:1"}
    one = _events(tmp_path / "one" / "neuron_trace_rank3_0.json")
    assert _complete(one, "kernel") == [("aten::mm", 1)] and _lanes(one) == {1: "neuron:1"}
    assert [e for e in one if e.get("pid") == 0] == []  # nothing of neuron:0's lane is left
    (fallback,) = _complete(one, "privateuse1_runtime")  # host work on neuron:0's tensors stays: it ran on the host
    assert fallback[0] == "CPU fallback: aten::atan2"
    assert [name for name, _ in _complete(one, "cpu_op")].count("aten::mm") == 2  # both CPU ops, the host's side


def test_on_the_pure_python_core_the_trace_has_the_host_side(run_python, tmp_path: Path) -> None:
    out = run_python(f"""
        import json, os, warnings, torch, neuron_lab
        from torch.profiler import profile, ProfilerActivity
        from torch_neuronx.profiling import NeuronConfig, NeuronProfiler
        from neuron_lab.backend.emulator import runtime
        warnings.simplefilter("ignore")
        cfg = NeuronConfig(profile_output_dir={str(tmp_path)!r})
        a = torch.randn(8, 8, device="neuron")
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], experimental_config=cfg,
                     on_trace_ready=NeuronProfiler(cfg).export_trace):
            torch.addmm(a, a, a)
        print(json.dumps(runtime.get().core))
    """, {"NEURON_LAB_CORE": "python"}, timeout=180)
    assert out == "python"
    events = _events(tmp_path / "neuron_trace_rank0_0.json")
    assert "aten::addmm" in [name for name, _ in _complete(events, "cpu_op")]
    assert _complete(events, "kernel") == [] and _lanes(events) == {}
