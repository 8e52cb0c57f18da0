"""What the compiled core adds (several devices, device generators, pinned memory, in-place storage resize,
caching-allocator statistics), and how the pure-Python core refuses the same requests.

``make test`` runs this file on both cores; each test asserts what its core promises.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import core
from torch import nn

import neuron_lab  # noqa: F401
from neuron_lab.backend.emulator import runtime

COMPILED = core() == "compiled"
compiled_only = pytest.mark.skipif(not COMPILED, reason="a compiled-core feature")
python_only = pytest.mark.skipif(COMPILED, reason="the pure-Python core's refusal")


# -- devices -------------------------------------------------------------------------------------
@compiled_only
def test_default_topology_is_a_trn2_3xlarge() -> None:
    n = torch.neuron
    assert n.device_count() == 4 and torch.accelerator.device_count() == 4
    assert [n.get_device_properties(i).total_memory for i in range(4)] == [24 * 1024**3] * 4
    assert n.get_device_name(3) == "neuron:3"


@compiled_only
def test_tensors_live_on_the_device_they_name_and_count_there() -> None:
    n = torch.neuron
    before = [n.memory_allocated(i) for i in range(4)]
    a = torch.ones(256, device="neuron:1")  # 1 KiB
    b = torch.ones(256, device="neuron:2") * 3
    assert (a.device, b.device) == (torch.device("neuron", 1), torch.device("neuron", 2))
    assert [n.memory_allocated(i) - before[i] for i in range(4)] == [0, 1024, 1024, 0]
    c = a.to("neuron:2") + b  # a copy between devices, then an op on one device
    assert c.device == torch.device("neuron", 2) and c.cpu().tolist() == [4.0] * 256
    del a, b, c
    assert [n.memory_allocated(i) for i in range(4)] == before


@compiled_only
def test_mixing_devices_raises_pytorchs_error() -> None:
    a, b = torch.ones(3, device="neuron:0"), torch.ones(3, device="neuron:1")
    with pytest.raises(RuntimeError, match=re.escape("Expected all tensors to be on the same device, but found at "
                                                     "least two devices, neuron:0 and neuron:1!")):
        torch.add(a, b)


@compiled_only
def test_set_device_and_device_context_choose_where_new_tensors_go() -> None:
    n = torch.neuron
    assert n.current_device() == 0
    with n.device(2):
        assert n.current_device() == 2 and torch.accelerator.current_device_index() == 2
        assert torch.empty(2, device="neuron").device.index == 2
    assert n.current_device() == 0
    n.set_device(1)
    try:
        assert torch.zeros(1, device="neuron").device.index == 1
    finally:
        n.set_device(0)


@compiled_only
def test_ddp_style_module_move_by_local_rank() -> None:
    model = nn.Linear(4, 2).to(torch.device("neuron", 3))
    out = model(torch.randn(5, 4, device="neuron:3"))
    out.sum().backward()
    assert {p.device.index for p in model.parameters()} == {3} and model.weight.grad.device.index == 3


@compiled_only
def test_a_device_past_the_last_is_an_invalid_device_id() -> None:
    with pytest.raises((RuntimeError, IndexError), match="Invalid device id 4"):
        torch.empty(2, device="neuron:4")
    with pytest.raises(ValueError, match="Invalid device id 7"):
        torch.neuron.set_device(7)


@python_only
@pytest.mark.parametrize("make", [
    lambda: torch.randn(2, device="neuron:1"),
    lambda: torch.ones(2).to("neuron:1"),
    lambda: torch.neuron.set_device(1),
], ids=["randn", "to", "set_device"])
def test_python_core_names_the_compiled_core_for_a_second_device(make) -> None:
    with pytest.raises((RuntimeError, ValueError), match="pure-Python core has one device"):
        make()


# -- random numbers ------------------------------------------------------------------------------
@compiled_only
def test_device_generators_draw_the_cpu_stream_for_the_same_seed() -> None:
    g = torch.Generator(device="neuron:1")
    assert g.device == torch.device("neuron", 1)
    g.manual_seed(7)
    cpu = torch.Generator().manual_seed(7)
    assert torch.equal(torch.randn(8, device="neuron:1", generator=g).cpu(), torch.randn(8, generator=cpu))


@compiled_only
def test_each_device_has_its_own_default_generator() -> None:
    torch.manual_seed(3)  # reaches every device, as on CUDA
    a = torch.rand(4, device="neuron:0").cpu()
    b = torch.rand(4, device="neuron:1").cpu()
    assert torch.equal(a, b)  # same seed, separate streams
    torch.neuron.manual_seed(5)  # the current device only
    state = torch.neuron.get_rng_state(1)
    x = torch.rand(4, device="neuron:1")
    torch.neuron.set_rng_state(state, 1)
    assert torch.equal(x.cpu(), torch.rand(4, device="neuron:1").cpu())


@compiled_only
def test_dropout_draws_from_the_device_generator() -> None:
    torch.neuron.manual_seed(11)
    x = torch.ones(1000, device="neuron")
    a = torch.nn.functional.dropout(x, 0.5).cpu()
    cpu_before = torch.get_rng_state()
    torch.neuron.manual_seed(11)
    b = torch.nn.functional.dropout(x, 0.5).cpu()
    assert torch.equal(a, b) and torch.equal(torch.get_rng_state(), cpu_before)


@python_only
def test_python_core_refuses_a_device_generator_clearly() -> None:
    with pytest.raises(RuntimeError):
        torch.Generator(device="neuron:1")


# -- memory --------------------------------------------------------------------------------------
@compiled_only
def test_pinned_memory_is_pinned_and_copies_non_blocking() -> None:
    t = torch.arange(6.0).pin_memory()
    assert t.is_pinned() and not torch.arange(3.0).is_pinned()
    d = t.to("neuron", non_blocking=True)
    assert d.cpu().tolist() == t.tolist()


@compiled_only
def test_storage_resize_is_in_place_so_views_keep_sharing() -> None:
    a = torch.zeros(4, device="neuron")
    b = a.view(4)
    b.resize_(100)
    b.fill_(1.0)
    assert a.cpu().tolist() == [1.0] * 4
    st = torch.UntypedStorage(16, device="neuron")
    ptr_before = st.data_ptr()
    st.resize_(64)
    assert st.nbytes() == 64 and st.device == torch.device("neuron", 0)
    assert isinstance(ptr_before, int)


def _core_stats() -> dict[str, int]:
    return runtime.get().memory.stats(0)


@compiled_only
def test_caching_allocator_statistics_follow_torchneuron() -> None:
    n = torch.neuron  # the size classes and pools are the core's own counters (CUDA's flat keys), not torch.neuron's
    n.empty_cache()
    base = _core_stats()
    x = torch.empty(1000, dtype=torch.uint8, device="neuron")  # 1000 B -> the 1024 B size class, small pool
    s = _core_stats()
    assert s["allocated_bytes.all.current"] - base["allocated_bytes.all.current"] == 1000
    assert s["reserved_bytes.small_pool.current"] - base["reserved_bytes.small_pool.current"] == 1024
    assert s["reserved_bytes.all.current"] >= s["allocated_bytes.all.current"] >= 0
    del x
    s = _core_stats()
    assert s["allocated_bytes.all.current"] == base["allocated_bytes.all.current"]
    assert s["reserved_bytes.all.current"] - base["reserved_bytes.all.current"] == 1024  # cached
    y = torch.empty(1000, dtype=torch.uint8, device="neuron")  # reuses the cached segment
    assert _core_stats()["num_device_alloc"] == s["num_device_alloc"]
    del y
    n.empty_cache()
    assert n.memory_reserved() == base["reserved_bytes.all.current"]
    big = torch.empty(3 * 2**20, dtype=torch.uint8, device="neuron")  # large pool
    assert _core_stats()["reserved_bytes.large_pool.current"] >= 3 * 2**20
    del big


@compiled_only
def test_torch_accelerator_is_served_by_the_core() -> None:
    torch.accelerator.synchronize()
    assert torch.accelerator.memory.memory_allocated(1) == torch.neuron.memory_allocated(1)
    s = torch.Stream(device="neuron:1")
    e0, e1 = torch.Event(enable_timing=True), torch.Event(enable_timing=True)
    e0.record(s)
    torch.ones(1000, device="neuron:1").sum()
    e1.record(s)
    assert e0.elapsed_time(e1) >= 0.0


def test_core_is_named_by_the_backend() -> None:
    from neuron_lab import backend

    b = backend.active()
    assert b.core == runtime.get().core
    word = "compiled core" if COMPILED else "pure-Python core"
    assert word in b.description


def test_both_cores_give_every_seam_the_interface_reads() -> None:
    """Each core's pieces satisfy the protocols of core_api, the running core's and the other's alike."""
    from types import SimpleNamespace

    from neuron_lab.backend.emulator import core_api, cpp_core, host, memory, python_core

    rt = runtime.get()
    for name, protocol in core_api.SEAMS.items():
        assert isinstance(getattr(rt, name), protocol), name
    stand_in = SimpleNamespace(**dict.fromkeys(("tracing", "profile_clock", "trace_collective", "to_host", "from_host"),
                                               print))  # a compiled core's functions, for the pieces that bind them
    allocator = memory.Allocator(1024)
    pieces = {"compiled": (cpp_core.CoreMemory(stand_in), cpp_core.CoreDevices(stand_in), cpp_core.CoreBridge(stand_in),
                           cpp_core.CoreTrace(stand_in)),
              "python": (allocator, python_core.PythonDevices(torch.Generator(), "why", 4), host.HostBridge(allocator),
                         runtime.NoDeviceTrace())}
    for core_name, made in pieces.items():
        for piece, protocol in zip(made, core_api.SEAMS.values()):
            assert isinstance(piece, protocol), (core_name, protocol.__name__)


@pytest.mark.core_in_child
def test_forcing_the_python_core_in_a_fresh_process() -> None:
    code = ("import torch, neuron_lab; from neuron_lab import backend; b = backend.active(); "
            "print(b.core, '|', b.core_reason, '|', torch.neuron.device_count())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "NEURON_LAB_CORE": "python"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "python | NEURON_LAB_CORE=python | 1"


def test_doctor_says_which_core_runs_and_why() -> None:
    out = subprocess.run([sys.executable, "-m", "neuron_lab", "doctor"], capture_output=True, text=True, timeout=120)
    line = next(ln for ln in out.stdout.splitlines() if ln.strip().startswith("core "))
    want = "compiled: compiled core loaded" if COMPILED else "python: NEURON_LAB_CORE=python"
    assert line.split(None, 1)[1] == want, out.stdout


def test_a_profile_has_device_lanes_only_where_the_core_can_add_them() -> None:
    """PyTorch's PrivateUse1 profiler hooks are C++ only: the compiled core's ops are device work on its own lanes,
    the pure-Python core's are host work, and its profile says so instead of showing an empty device column."""
    from neuron_lab.report.profiled_rows import device_notes, profiled_head
    from neuron_lab.trace.profile import OpProfile

    x = torch.ones(64, 64, device="neuron")
    prof = OpProfile().start()
    try:
        (x @ x).sum().item()
    finally:
        prof.stop()
    p = prof.result()
    assert p.device_timing is COMPILED and any(r.op == "aten::mm" for r in p.rows)
    assert bool(p.lanes) is COMPILED
    notes = device_notes(p)
    if COMPILED:
        assert " device (host clock) " in profiled_head(p) and notes[0].startswith("device lanes: the emulator's own")
    else:
        assert profiled_head(p).endswith(("ms", "µs", "s")) and "device" not in profiled_head(p)
        assert notes == ["no device time: the pure-Python core adds no device lanes to torch.profiler (its ops are "
                         "host work; the compiled core adds them)"]


def test_a_core_built_for_another_torch_minor_is_not_loaded(tmp_path) -> None:
    """A copy of the package whose core record (setup.py writes it with the core) names another torch minor: doctor
    says so and what to do, the pure-Python core serves, and the compiled core is never imported (another libtorch's
    C++ ABI can crash the process). The real loader reads the real file; `make wheel-check` does it on a wheel."""
    shutil.copytree(Path(neuron_lab.__file__).parent, tmp_path / "neuron_lab",
                    ignore=shutil.ignore_patterns("__pycache__"))
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    other, this = f"{major}.{minor - 1}", f"{major}.{minor}"
    (tmp_path / "neuron_lab/backend/emulator/_core_torch.py").write_text(f'TORCH_VERSION = "{other}.0"\n')
    code = ("import sys, neuron_lab; from neuron_lab import cli; cli.main(['doctor']); "
            "print(neuron_lab.__file__, 'neuron_lab.backend.emulator._core' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k != "NEURON_LAB_CORE"}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**env, "PYTHONPATH": os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])})
    assert out.returncode == 0, out.stderr
    line = next(ln for ln in out.stdout.splitlines() if ln.strip().startswith("core "))
    assert line.split(None, 1)[1] == (
        f"python: built for torch {other}, this is torch {this}: running the pure-Python core; install the neuron_lab "
        f"wheel built for torch {this}, or build from source with "
        "`pip install --no-build-isolation --force-reinstall neuron_lab`"), out.stdout
    assert out.stdout.strip().splitlines()[-1] == f"{tmp_path / 'neuron_lab/__init__.py'} False"


@compiled_only
def test_topology_settings_select_devices_as_the_runtime_does() -> None:
    code = ("import torch, neuron_lab; print(torch.neuron.device_count(), "
            "torch.neuron.get_device_properties(0).total_memory // 2**30)")
    env = {**__import__("os").environ}
    cases = [({"NEURON_LAB_INSTANCE": "trn2.48xlarge"}, "64 24"),
             ({"NEURON_LAB_INSTANCE": "trn2.48xlarge", "NEURON_LOGICAL_NC_CONFIG": "1"}, "127 12"),
             ({"NEURON_RT_VISIBLE_CORES": "1-2"}, "2 24"),
             ({"NEURON_RT_NUM_CORES": "1"}, "1 24"),
             ({"NEURON_LAB_DEVICE_MEMORY": "2GiB"}, "4 2")]
    for extra, want in cases:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                             env={**env, **extra})
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == want, extra


@pytest.mark.parametrize("value", ["-1", "-5GiB", "0", "1e999", "lots"])
def test_a_bad_capacity_is_reported_and_the_default_used(value) -> None:
    code = "import torch, neuron_lab; print(torch.neuron.get_device_properties(0).total_memory // 2**30)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "NEURON_LAB_DEVICE_MEMORY": value})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "24"
    assert "NEURON_LAB_DEVICE_MEMORY" in out.stderr and "using 24.00 GiB" in out.stderr


# -- ops real models need --------------------------------------------------------------------------
def test_histc_on_int32_works_as_on_a_device() -> None:
    # transformers' MoE routing (Mixtral, Qwen2-MoE) counts tokens per expert like this on every non-CPU device.
    experts = torch.tensor([0, 2, 2, 3, 1, 2], dtype=torch.int32)
    got = torch.histc(experts.to("neuron"), bins=4, min=0, max=3)
    assert got.device.type == "neuron" and got.dtype == torch.int32
    assert got.cpu().tolist() == [1, 1, 3, 1]
    with pytest.raises(RuntimeError):
        torch.histc(experts, bins=4, min=0, max=3)  # the CPU has no int kernel: the device must not inherit that


def test_group_norm_on_channels_last_matches_the_cpu() -> None:
    # diffusers' UNet2DModel and AutoencoderKL run group_norm on channels-last activations.
    torch.manual_seed(0)
    x = torch.randn(2, 8, 5, 5).to(memory_format=torch.channels_last)
    gn = nn.GroupNorm(4, 8)
    gn_dev = __import__("copy").deepcopy(gn).to("neuron")
    want = gn(x)
    got = gn_dev(x.to("neuron"))
    assert torch.allclose(got.cpu(), want, atol=1e-6)
    grad = torch.randn(2, 8, 5, 5).to(memory_format=torch.channels_last)
    got.backward(grad.to("neuron"))  # the input needs no gradient: torch 2.13's CPU kernel crashes on that
    x.requires_grad_()
    gn(x).backward(grad)  # the CPU reference, with an input gradient (the case the CPU survives)
    assert torch.allclose(gn_dev.weight.grad.cpu(), gn.weight.grad, atol=1e-5)


# -- interrupts --------------------------------------------------------------------------------------
_INTERRUPTED_LOOP = r"""
import gc, json, sys
import torch, neuron_lab

x = torch.ones(64, device="neuron")
gc.collect()
base = torch.neuron.memory_allocated()
caught = 0
while caught < TIMES:
    try:
        with neuron_lab.track():  # a subscriber: fallback ops call into Python, where interrupts land
            print(caught, flush=True)  # the parent interrupts only once this is read: always inside the try
            while True:
                y = torch.atan2(x, x) + x * 2  # a CPU fallback and native ops
                z = y.sum()
    except KeyboardInterrupt:
        caught += 1
y = z = None
gc.collect()
print(json.dumps({"caught": caught, "leaked": torch.neuron.memory_allocated() - base}), flush=True)
"""


def test_interrupts_during_device_work_reach_the_user_and_leak_nothing() -> None:
    import json
    import os
    import random
    import signal

    from procs import Lines, default_sigint

    times = 300
    proc = subprocess.Popen([sys.executable, "-c", _INTERRUPTED_LOOP.replace("TIMES", str(times))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint)
    out, err = Lines(proc.stdout), Lines(proc.stderr)
    try:
        rng = random.Random(0)
        for i in range(times):
            line = out.next(60, f"the loop's line {i} (interrupt {i} of {times})")
            assert line.strip() == str(i), line + err.rest(10, "the child's stderr")[-3000:]
            __import__("time").sleep(rng.uniform(0.0002, 0.003))
            os.kill(proc.pid, signal.SIGINT)
        result = json.loads(out.next(60, "the loop's closing JSON line"))
        assert proc.wait(timeout=60) == 0, err.rest(10, "the child's stderr")[-3000:]
    finally:
        proc.kill()
    assert result == {"caught": times, "leaked": 0}
