"""`import torch_neuronx` on the emulator: served by neuron_lab where no real torch-neuronx is installed, with
TorchNeuron's names and semantics, saying plainly that it is the emulation; and NKI custom ops.

Import-system behaviour is tested in fresh interpreters (``run_python``): what a user's process sees from
its first ``import torch``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import torch
from conftest import ROOT, STARTUP, wheel_without_core

import neuron_lab
from neuron_lab import backend


def test_torch_neuronx_is_the_emulation_with_torchneurons_surface(run_python) -> None:
    out = run_python("""
        import importlib.metadata, importlib.util, json
        import torch
        spec = importlib.util.find_spec("torch_neuronx")   # what transformers and accelerate ask
        import torch_neuronx, torch_neuronx.distributed, torch_neuronx.profiling
        try:
            importlib.metadata.version("torch-neuronx")
            meta = "found"
        except importlib.metadata.PackageNotFoundError:
            meta = "none"
        torch_neuronx.clear_op_tracking()
        x = torch.arange(6.0, device="neuron").reshape(2, 3)
        y = torch.atan2(x, x + 1)
        torch.neuron.synchronize()
        fallback, executed = torch_neuronx.get_fallback_ops(), torch_neuronx.get_executed_ops()
        torch_neuronx.clear_op_tracking()
        errors = []
        for call in (lambda: torch_neuronx.set_device(torch.device("neuron:1")),
                     lambda: torch_neuronx.set_device(torch.neuron.device_count()),
                     lambda: torch_neuronx.wrap_nki(print)):
            try:
                call()
            except Exception as e:
                errors.append(f"{type(e).__name__}: {e}")
        last = torch.neuron.device_count() - 1
        torch_neuronx.set_device(last)
        print(json.dumps({"spec": spec is not None, "meta": meta, "repr": repr(torch_neuronx),
                          "version": torch_neuronx.__version__, "emulated": torch_neuronx.EMULATED,
                          "fallback": fallback, "executed": executed, "cleared": torch_neuronx.get_fallback_ops(),
                          "types": [type(fallback).__name__, type(torch_neuronx.get_dynamo_metrics()).__name__],
                          "count": torch_neuronx.device_count(), "devices": torch.neuron.device_count(),
                          "current": torch.neuron.current_device() == last,
                          "same_module": torch_neuronx.neuron.memory_stats is torch.neuron.memory_stats,
                          "profiler": torch_neuronx.NeuronProfiler is torch_neuronx.profiling.NeuronProfiler,
                          "errors": errors}))
    """, {})
    assert out["spec"] and out["meta"] == "none"  # find_spec sees it; pip and importlib.metadata do not
    assert "neuron_lab" in out["repr"] and out["version"] == "2.13.3.0+neuronlab.emulator" and out["emulated"]
    assert out["fallback"] == ["aten::atan2.out"] and "aten::add.Tensor" in out["executed"] and out["cleared"] == []
    assert out["types"] == ["list", "list"]  # unique names in a list, as TorchNeuron's binding returns them
    assert (out["count"], out["current"], out["same_module"], out["profiler"]) == (out["devices"], True, True, True)
    by_device, out_of_range, wrap = out["errors"]
    assert by_device.startswith("ValueError: Invalid device id device(type='neuron', index=1)")
    n = out["devices"]  # 4 on the compiled core (a trn2.3xlarge), 1 on the pure-Python core
    assert out_of_range == f"ValueError: Invalid device id {n}: torch_neuronx.set_device takes an int in [0, {n})"
    assert wrap.startswith("NotEmulatedError: wrap_nki runs NKI kernels through NKI's CPU simulator, which needs "
                           "AWS's `nki` package: pip install nki --extra-index-url https://pip.repos.neuron.amazonaws.com")


def test_a_real_torch_neuronx_on_the_path_always_wins(run_python, tmp_path) -> None:
    pkg = tmp_path / "torch_neuronx"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("REAL = True\n")
    out = run_python("""
        import json, torch, neuron_lab, torch_neuronx
        print(json.dumps({"real": getattr(torch_neuronx, "REAL", False),
                          "emulated": getattr(torch_neuronx, "EMULATED", False)}))
    """, {"PYTHONPATH": str(tmp_path)})
    assert out == {"real": True, "emulated": False}




def first_import(run_python, site: Path, env: dict[str, str]) -> dict:
    return run_python(f"""
        import json, site, sys
        site.addsitedir({str(site)!r})   # processes the .pth there, as at start-up
        before = sorted(m for m in ("torch", "neuron_lab") if m in sys.modules)
        import torch_neuronx
        left = [type(f).__name__ for f in sys.meta_path].count("NeuronLabStartupFinder")
        print(json.dumps({{"before": before, "emulated": torch_neuronx.EMULATED, "startup_finders": left}}))
    """, env)


@pytest.mark.parametrize("autoload", ["1", "0"])
def test_torch_neuronx_can_be_the_first_import_of_a_process(run_python, tmp_path, autoload) -> None:
    for name in STARTUP:
        shutil.copy(ROOT / name, tmp_path / name)
    out = first_import(run_python, tmp_path, {"TORCH_DEVICE_BACKEND_AUTOLOAD": autoload})
    assert out == {"before": [], "emulated": True, "startup_finders": 0}  # nothing imported until asked; then gone


def test_torch_neuronx_is_the_first_import_in_the_installed_venv() -> None:
    """As installed, not from copied files: in `make`'s venv (an editable install) as from a wheel, a process whose
    first statement is ``import torch_neuronx`` gets the emulation and a working device."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent("""\
        import sys
        before = sorted(m for m in ("torch", "neuron_lab") if m in sys.modules)
        import torch_neuronx
        import torch
        x = torch.arange(4.0, device="neuron")
        print(before, torch_neuronx.EMULATED, x.device, (x * 2).sum().item())
    """)], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, (
        f"`import torch_neuronx` first failed in {sys.prefix}: is neuron_lab-torch_neuronx.pth in its site-packages? "
        f"(reinstall: `make`, or pip install -e .)\n{proc.stderr[-3000:]}")
    assert proc.stdout.split() == ["[]", "True", "neuron:0", "12.0"]


@pytest.mark.core_in_child
def test_the_wheel_installs_the_startup_hook_into_site_packages(run_python, tmp_path) -> None:
    """Built from a copy of the sources, so the build never writes into the tree other tests import from; it carries
    every data file the package reads. Its files are no core's: the compiled pass alone builds it, and its child
    starts on the default core."""
    wheel, src = wheel_without_core(tmp_path)
    site = tmp_path / "site"
    # the files the package reads at run time (coverage data, the widgets' scripts), not its build inputs
    data = {p.relative_to(src).as_posix() for p in (src / "neuron_lab").rglob("*")
            if p.is_file() and p.suffix not in (".py", ".cpp", ".h") and "__pycache__" not in p.parts}
    assert any(name.endswith(".json") for name in data) and any(name.endswith(".js") for name in data)
    with zipfile.ZipFile(wheel) as z:
        assert set(STARTUP) <= set(z.namelist())  # at the top of the wheel: site-packages itself
        assert sorted(data - set(z.namelist())) == []
        z.extractall(site, members=list(STARTUP))
    assert first_import(run_python, site, {"NEURON_LAB_CORE": "auto"})["emulated"]


def test_the_emulation_is_served_even_with_backend_autoload_off(run_python) -> None:
    out = run_python("""
        import json, importlib.util, torch, neuron_lab
        print(json.dumps({"spec": importlib.util.find_spec("torch_neuronx") is not None}))
    """, {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert out == {"spec": True}


@pytest.fixture(scope="module")
def torch_neuronx():
    import torch_neuronx

    assert torch_neuronx.EMULATED
    return torch_neuronx


def test_an_nki_op_runs_its_torch_body_on_the_device_as_one_kernel(torch_neuronx) -> None:
    @torch_neuronx.nki_op("nltest::scaled_atan2", mutates_args=())
    def scaled_atan2(a: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
        """atan2 falls back on TorchNeuron as an op; inside a kernel it is the kernel's business."""
        return torch.atan2(a, b) * scale

    a, b = torch.randn(3, 5), torch.randn(3, 5)
    with neuron_lab.track() as report:
        out = scaled_atan2(a.to("neuron"), b.to("neuron"), 2.0)
    assert out.device == torch.device("neuron", 0)
    torch.testing.assert_close(out.cpu(), torch.atan2(a, b) * 2.0)
    rows = [(r.op, r.kind, r.count) for r in report.ops_not_native]
    assert rows == [("nltest::scaled_atan2", "nki", 1)]  # the body's atan2 is not a CPU fallback of the cell
    assert report.fallbacks == [] and report.ops == 3  # the kernel, and the two copies to the device
    assert "NKI kernels (1 op, 1 call" in str(report) and "no CPU fallbacks" in str(report)
    (site,) = report.ops_not_native[0].sites
    assert site.site.source == 'out = scaled_atan2(a.to("neuron"), b.to("neuron"), 2.0)'

    assert "nltest::scaled_atan2" not in torch_neuronx.get_fallback_ops()
    assert repr(scaled_atan2) == "<NKI op nltest::scaled_atan2 (emulated: runs its torch body)>"


def test_an_nki_op_takes_register_autograd_and_compiles(torch_neuronx) -> None:
    @torch_neuronx.nki_op("nltest::cube")
    def cube(x: torch.Tensor) -> torch.Tensor:
        return x * x * x

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 3 * x * x

    cube.register_autograd(backward, setup_context=setup_context)
    x = torch.tensor([1.0, 2.0, -3.0], device="neuron", requires_grad=True)
    cube(x).sum().backward()
    torch.testing.assert_close(x.grad.cpu(), torch.tensor([3.0, 12.0, 27.0]))

    compiled = torch.compile(lambda t: cube(t) + 1, backend="neuron", fullgraph=True)
    torch.testing.assert_close(compiled(x.detach()).cpu(), torch.tensor([2.0, 9.0, -26.0]))


def test_wrap_nki_runs_a_kernel_through_the_nki_simulator(run_python, tmp_path) -> None:
    """AWS's `nki` package cannot be installed here (PyPI's `nki` is a placeholder), so a stand-in with its
    `simulate_kernel(kernel, *arrays)` entry point checks the path: numpy in, numpy out, one NKI kernel."""
    stand_in = tmp_path / "nki"
    stand_in.mkdir()
    (stand_in / "__init__.py").write_text("def simulate_kernel(kernel, *arrays):\n    return kernel(*arrays)\n")
    out = run_python("""
        import json, torch, neuron_lab, torch_neuronx

        def add_kernel(a, b):  # what an @nki.jit kernel computes, on the simulator's numpy arrays
            return a + b

        @torch_neuronx.nki_op("nltest::nki_add")
        def nki_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return torch_neuronx.wrap_nki(add_kernel)(a, b)

        x = torch.arange(4.0, device="neuron")
        with neuron_lab.track() as r:
            y = nki_add(x, x)
        print(json.dumps({"y": y.cpu().tolist(), "device": str(y.device),
                          "rows": [[row.op, row.kind] for row in r.ops_not_native]}))
    """, {"PYTHONPATH": str(tmp_path)})
    assert out == {"y": [0.0, 2.0, 4.0, 6.0], "device": "neuron:0", "rows": [["nltest::nki_add", "nki"]]}


def test_a_bad_nki_op_name_is_refused(torch_neuronx) -> None:
    with pytest.raises(ValueError, match=r"nki_op needs a name like 'mylib::rmsnorm', not 'rmsnorm'"):
        torch_neuronx.nki_op("rmsnorm")(lambda x: x)


def test_doctor_says_torch_neuronx_is_emulated(capsys) -> None:
    from neuron_lab import cli

    assert cli.main(["doctor"]) in (0, 1)
    line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("torch_neuronx"))
    assert "emulated by neuron_lab" in line and backend.state().kind == "emulator"


def test_the_emulation_is_not_imported_by_neuron_lab_itself() -> None:
    """Libraries decide from find_spec; nothing of neuron_lab imports it on their behalf."""
    import subprocess

    code = "import sys, torch, neuron_lab; print('torch_neuronx' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


# -- issue 27: what code written for TorchNeuron notices --------------------------------------------------------------
def test_op_tracking_names_carry_their_overloads_as_torchneurons_do(torch_neuronx) -> None:
    """TorchNeuron names an op by its schema's operator name (NeuronBindings.cpp: toString(operator_name()));
    neuron_lab's own rows keep the base name with the overload beside it."""
    torch_neuronx.clear_op_tracking()
    x = torch.arange(6.0, device="neuron")
    torch.atan2(x, x + 1)
    assert torch_neuronx.get_fallback_ops() == ["aten::atan2.out"]
    assert "aten::add.Tensor" in torch_neuronx.get_executed_ops()
    assert backend.active().get_fallback_ops() == {"aten::atan2"}
    assert [(s.name, s.overload) for s in backend.active().op_stats("fallback")] == [("aten::atan2", "out")]


def test_dynamo_metrics_records_have_attributes_like_torchneurons_dataclass(torch_neuronx) -> None:
    torch.neuron.reset_dynamo_metrics()
    torch_neuronx.neuron_dynamo_backend.set_model_name("tiny")
    try:
        f = torch.compile(lambda t: t * 2 + 1, backend="neuron", fullgraph=True)
        f(torch.ones(3, device="neuron"))
    finally:
        torch_neuronx.neuron_dynamo_backend.set_model_name(None)
    (m,) = torch_neuronx.get_dynamo_metrics()
    assert type(m).__name__ == "NeuronCompilationMetrics" and m.graph_name.startswith("tiny_")
    assert m.torch_neuronx_compile_us >= m.torch_neuronx_lower_us >= 0 and m.graph_node_count > 0
    assert m["graph_name"] == m.graph_name and dict(m)["lowering"] == m.lowering  # item access kept


def test_torch_neuron_stream_takes_keywords_only_and_the_stream_functions_exist(torch_neuronx) -> None:
    with pytest.raises(TypeError, match=r"keyword arguments only.*torch\.neuron\.Stream\(device=\.\.\.\)"):
        torch.neuron.Stream(0)
    s = torch.neuron.Stream(device="neuron:0", priority=0)
    assert isinstance(s, torch_neuronx.Stream) and torch_neuronx.Stream(0).device == s.device  # the class takes both
    ctx = torch.neuron.stream(s)
    assert isinstance(ctx, torch_neuronx.StreamContext) and isinstance(torch_neuronx.StreamContext, type)
    with ctx:
        torch.neuron.wait_stream(s)
        ev = torch.neuron.record_event()
        torch.neuron.wait_event(ev)
    assert torch.neuron.query() and ev.query() and torch.neuron._sleep(10) is None


def test_the_missing_modules_import_with_the_functions_users_call(torch_neuronx) -> None:
    import torch_neuronx.metrics as met
    import torch_neuronx.neuron_dynamo_backend as ndb
    import torch_neuronx.utils as tnu

    assert (met.get_counter_names(), met.get_counter_value("CompilationCache.InMemoryHits")) == ([], None)
    assert met.get_compilation_metrics() == {} and "compiles no NEFF" in met.report() and not met.is_enabled()
    met.set_enabled(True)
    assert met.is_enabled()
    met.set_enabled(False)
    family = backend.active()._rt.topology.instance.split(".")[0]
    assert tnu.get_platform_target() == family
    assert tnu.is_float8_e4m3_supported() == (family == "trn2") != tnu.is_float8_e4m3fn_supported()
    assert tnu.get_logical_neuron_cores() == str(backend.active()._rt.topology.lnc) and tnu.use_mlir_aten_ops()
    assert tnu.move_pytree_to_cpu({"a": [torch.ones(1, device="neuron")]})["a"][0].device.type == "cpu"
    assert ndb.get_rank() == torch.neuron.current_device() and ndb.get_model_name() == "model_default"
    assert ndb.get_dynamo_metrics is torch_neuronx.get_dynamo_metrics and callable(ndb.create_neuron_backend())
    with pytest.raises(torch_neuronx.NotEmulatedError, match="does not lower to MLIR"):
        ndb.save_mlir("x", "y")


def test_the_runtime_starts_at_the_users_first_device_use(run_python) -> None:
    # One process (one import of torch): each first use runs in a child forked before any device use (which may use
    # it), then the process itself reads what neuron_lab reads and makes a tensor.
    out = run_python("""
        import json, os, torch, neuron_lab, torch_neuronx
        from neuron_lab import backend

        def in_child(use):
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                try:  # a use that raises writes nothing: the parent reads null
                    before = torch_neuronx.is_neuron_runtime_initialized()
                    use()
                    os.write(w, json.dumps([before, torch_neuronx.is_neuron_runtime_initialized()]).encode())
                finally:
                    os._exit(0)
            os.waitpid(pid, 0)
            os.close(w)
            return json.loads(os.read(r, 100000).decode() or "null")

        uses = [in_child(torch.neuron.init), in_child(lambda: torch.neuron.get_device_properties(0)),
                in_child(torch.neuron.synchronize)]
        b = backend.active()
        ours = [b.capacity(), b.memory_sample(), b.synchronize(), b.memory_stats(), torch.neuron.device_count()]
        before = [torch_neuronx.is_neuron_runtime_initialized(), torch.neuron.is_initialized()]
        x = torch.empty(4, device="neuron")
        after = [torch_neuronx.is_neuron_runtime_initialized(), torch.neuron.is_initialized()]
        print(json.dumps({"uses": uses, "before": before, "after": after}))
    """, {})
    assert out["uses"] == [[False, True]] * 3  # init(), get_device_properties(0), synchronize() each start it
    assert out["before"] == [False, False] and out["after"] == [True, True]  # neuron_lab's own reads started nothing


def test_a_child_forked_after_the_runtime_started_refuses_the_device(run_python) -> None:
    """TorchNeuron's words (torch_neuronx/__init__.py _lazy_init); a DataLoader worker started with fork is such a
    child. A child forked before any device use may use it."""
    out = run_python("""
        import json, os, torch, neuron_lab, torch_neuronx

        def in_child(fn):
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                try:
                    res = fn()
                except RuntimeError as e:
                    res = str(e)
                os.write(w, json.dumps(res).encode())
                os._exit(0)
            os.waitpid(pid, 0)
            os.close(w)
            return json.loads(os.read(r, 100000).decode())

        fresh = in_child(lambda: [torch.ones(2, device="neuron").sum().item(), torch.neuron._is_in_bad_fork()])
        x = torch.ones(2, device="neuron")
        child = in_child(lambda: [torch.neuron._is_in_bad_fork(), torch_neuronx._is_in_bad_fork,
                                  torch_neuronx.is_neuron_runtime_initialized()])
        op = in_child(lambda: (x + 1).tolist())
        init = in_child(torch.neuron.init)
        print(json.dumps({"fresh": fresh, "child": child, "op": op, "init": init,
                          "parent": [(x + 1).tolist(), torch.neuron._is_in_bad_fork()]}))
    """, {})
    msg = ("Cannot re-initialize Neuron runtime in forked subprocess. "
           "To use Neuron with multiprocessing, use the 'spawn' start method")
    assert out == {"fresh": [2.0, False], "child": [True, True, False], "op": msg, "init": msg,
                   "parent": [[2.0, 2.0], False]}
