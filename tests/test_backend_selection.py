"""Which `neuron` backend a process gets, from `import torch` on, each scenario in a fresh interpreter.

PrivateUse1 is claimed once per process, so every case runs in a child. A "torch-neuronx
installed" case puts the fake distribution of ``tests/fake_torchneuronx`` on the path: what these
tests show about the real TorchNeuron holds only as far as that fake follows its source
(registration at import whoever owns PrivateUse1, the torch.backends entry point that makes it
native whatever its version, the runtime started only by the first device use).
Where the fake sits on the path decides which package's entry points PyTorch runs first; both
orders happen in real environments, and the tests cover both.
"""

from __future__ import annotations

import textwrap

import pytest
from fake_torchneuronx import BIN, SITE, make_site, run

# Printed by a child after its scenario: what neuron_lab decided, who owns the device, whether it works.
PROBE = """
import json as _json, sys as _sys
import torch as _torch
from neuron_lab import backend as _backend
from neuron_lab.backend.emulator import runtime as _runtime

_d = _backend.state()
try:
    _active = _backend.active().kind
except _backend.BackendUnavailable as _e:
    _active = f"unavailable: {_e}"
try:
    _device = str((_torch.randn(2, device="neuron") + 1).device)
except Exception as _e:
    _device = f"{type(_e).__name__}"
_tnx = _sys.modules.get("torch_neuronx")
print(_json.dumps({
    "kind": _d.kind, "reason": _d.reason, "problems": _d.problems, "active": _active, "device": _device,
    "owner": _torch._C._get_privateuse1_backend_name(),
    "module": getattr(getattr(_torch, "neuron", None), "__name__", None),
    "emulator_installed": _runtime.installed(),
    "tnx_registered": getattr(_tnx, "registered", None),
}))
"""
EMULATOR_MODULE = "neuron_lab.backend.emulator.device_module"
FAKE_MODULE = "torch_neuronx.neuron"
INSTALL_FAILURE = ("the emulator failed to install: RuntimeError: NEURON_LAB_CORE=compiled, but the compiled core is "
                   "not built in this install (no compiler at install time, or NEURON_LAB_BUILD_CORE=0); build it for "
                   "this torch with `pip install --no-build-isolation --force-reinstall neuron_lab`")


def probe_after(*scenario: str, **extra: str) -> str:
    """The ``scenario`` snippets, then PROBE; ``extra`` adds fields (name -> expression) to the probe's JSON."""
    fields = "".join(f"{k!r}: {v}, " for k, v in extra.items())
    code = "\n".join(textwrap.dedent(part) for part in scenario)
    return code + PROBE.replace("print(_json.dumps({", "print(_json.dumps({" + fields)


def doctor_lines(text: str) -> dict[str, str]:
    """``neuron-lab doctor`` output keyed by its first word (backend, active, devices, problems, ...)."""
    lines: dict[str, str] = {}
    for line in text.splitlines():
        word, _, rest = line.strip().partition(" ")
        lines.setdefault(word, rest.strip())
    return lines


def problems_of(text: str) -> list[str]:
    after = text.split("  problems", 1)[1].splitlines()[1:]
    return [line.strip().removeprefix("- ") for line in after if line.strip().startswith("- ")]


DOCTOR_IN_PROCESS = """
import contextlib, io
from neuron_lab import cli
_out = io.StringIO()
with contextlib.redirect_stdout(_out):
    rc = cli.main(["doctor"])
doctor = _out.getvalue()
"""


def test_import_torch_alone_provides_the_emulator():
    r = run(probe_after("import torch", DOCTOR_IN_PROCESS, doctor="doctor", rc="rc"))
    s = r.json()
    assert s["kind"] == "emulator" and s["active"] == "emulator"
    assert s["reason"] == "torch-neuronx is not installed: using the bundled emulator"
    assert s["device"] == "neuron:0" and s["module"] == EMULATOR_MODULE
    assert s["problems"] == [] and "Warning" not in r.err
    assert s["rc"] == 0
    d = doctor_lines(s["doctor"])
    assert d["backend"] == "emulator: torch-neuronx is not installed: using the bundled emulator"
    assert d["active"].startswith("emulator (neuron_lab, compiled core; trn2.3xlarge at LNC=2: 4 device(s)")
    assert d["core"] == "compiled: compiled core loaded"
    assert d["devices"] == "4 (neuron:0..neuron:3); capacity 24.00 GiB per device"  # a trn2.3xlarge
    assert d["autoload"] == "entry point neuron_lab = neuron_lab.backend.autoload:_autoload: ran"
    assert d["problems"] == "none"


def test_autoload_off_leaves_privateuse1_alone_until_import_neuron_lab():
    s = run(probe_after("""
        import sys
        import torch
        before = {"owner": torch._C._get_privateuse1_backend_name(), "loaded": "neuron_lab" in sys.modules}
        import neuron_lab
    """, before="before"), env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}).json()
    assert s["before"] == {"owner": "privateuseone", "loaded": False}
    assert s["kind"] == "emulator" and s["device"] == "neuron:0" and s["module"] == EMULATOR_MODULE


@pytest.mark.parametrize("order", ["torch-neuronx first", "neuron_lab first"])
def test_native_torchneuronx_is_deferred_to(order):
    """Whichever entry point PyTorch runs first, the installed TorchNeuron owns `neuron`, never the emulator."""
    s = run(probe_after("import torch", DOCTOR_IN_PROCESS, doctor="doctor", rc="rc"), site=SITE,
            site_last=order == "neuron_lab first").json()
    assert s["kind"] == "torchneuron" and s["active"] == "torchneuron"
    assert s["reason"] == "torch-neuronx 2.14.3.0 is installed (native TorchNeuron backend)"
    assert s["module"] == FAKE_MODULE and s["tnx_registered"] is True
    assert s["emulator_installed"] is False and s["device"] == "neuron:0" and s["problems"] == []
    assert s["rc"] == 0
    d = doctor_lines(s["doctor"])
    assert d["backend"] == "torchneuron: torch-neuronx 2.14.3.0 is installed (native TorchNeuron backend)"
    assert d["active"] == "TorchNeuron (torch-neuronx 2.14.3.0)"
    # doctor never starts the Neuron runtime (it would take every NeuronCore): the capacity waits for device use
    assert d["devices"] == "1 (neuron:0); capacity after first device use"
    assert d["build"] == "RELEASE (torch_neuronx._build_config.BUILD_TYPE)"
    assert d["coverage"] == "none: the real device reports its own fallbacks"
    assert d["problems"] == "none"
    # what torch_neuronx's import set itself: known for sure when neuron_lab imported it, else by its default
    who = "set by torch_neuronx at import" if order == "neuron_lab first" else "torch_neuronx's import default"
    for name, value in (("NEURON_LAUNCH_BLOCKING", "'1'"),
                        ("TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS", "'0'")):
        assert d[name].startswith(value) and f"[{who}]" in d[name], d[name]  # a RELEASE build's defaults
    assert d["TORCH_NEURONX_LOG_LEVEL"].startswith("(unset)") and "[" not in d["TORCH_NEURONX_LOG_LEVEL"]
    assert d["TorchNeuron"] == "settings (read by TorchNeuron; those it set at import when unset are marked)"


def test_a_dev_build_versioned_0_1_0_is_native_torchneuron(tmp_path):
    """A DEV or source build is version 0.1.0 (tnx pyproject.toml:3): its torch.backends entry point makes it native."""
    site = make_site(tmp_path, "0.1.0", build="DEV")
    s = run(probe_after("import torch", DOCTOR_IN_PROCESS, doctor="doctor"), site=site).json()
    assert s["kind"] == "torchneuron" and s["module"] == FAKE_MODULE and s["device"] == "neuron:0"
    assert s["reason"] == "torch-neuronx 0.1.0 is installed (native TorchNeuron backend)"
    assert s["emulator_installed"] is False and s["problems"] == []
    d = doctor_lines(s["doctor"])
    assert d["build"] == "DEV (torch_neuronx._build_config.BUILD_TYPE)"
    assert d["TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS"].startswith("'1'")  # the DEV default


def test_legacy_torchneuronx_gets_the_emulator(tmp_path):
    site = make_site(tmp_path, "2.12.0", entry_points=False)
    s = run("import torch\nimport torch_neuronx\n" + PROBE, site=site).json()
    assert s["kind"] == "emulator" and s["module"] == EMULATOR_MODULE and s["device"] == "neuron:0"
    assert s["reason"] == ("torch-neuronx 2.12.0 is the legacy XLA library, not TorchNeuron; "
                           "using the bundled emulator")
    assert s["tnx_registered"] is False  # the legacy library never touches PrivateUse1


REFUSED = ("NEURON_LAB_BACKEND=emulator refused: the native torch-neuronx 2.14.3.0 is installed and takes the "
           "'neuron' device whenever it is imported, so the emulator cannot sit beside it; use an environment "
           "without torch-neuronx for the emulator")


@pytest.mark.parametrize(("order", "code", "env"), [
    ("torch-neuronx first", "import torch\n", {}),
    ("neuron_lab first", "import torch\nimport torch_neuronx\n", {}),
    ("autoload off, neuron_lab imported first", "import torch\nimport neuron_lab\nimport torch_neuronx\n",
     {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}),
])
def test_the_emulator_is_refused_beside_native_torchneuronx(order, code, env):
    """TorchNeuron registers `neuron` at every import and never gives way (tnx torch_neuronx/__init__.py:67-72,
    119-128), so an emulator installed first would break `import torch` or `import torch_neuronx`: whatever the
    order, the emulator is not installed, TorchNeuron serves `neuron`, and the refusal is a warning and a problem."""
    r = run(code + PROBE, site=SITE, site_last=order == "neuron_lab first",
            env={"NEURON_LAB_BACKEND": "emulator", **env})
    s = r.json()
    assert s["kind"] == "torchneuron" and s["module"] == FAKE_MODULE and s["device"] == "neuron:0"
    assert s["reason"] == ("torch-neuronx 2.14.3.0 is installed (native TorchNeuron backend; "
                           "NEURON_LAB_BACKEND=emulator refused)")
    assert s["emulator_installed"] is False and s["tnx_registered"] is True
    assert s["problems"] == [REFUSED]
    assert f"RuntimeWarning: neuron_lab: {REFUSED}" in r.err


def test_the_stand_in_never_backs_off_like_the_real_package():
    """With the emulator forced in first, importing torch_neuronx fails, as the real one does."""
    r = run("""
        import torch, neuron_lab
        from neuron_lab.backend import emulator
        emulator.install()
        try:
            import torch_neuronx
            print("imported")
        except RuntimeError as e:
            print("refused:", type(e).__name__)
    """, site=SITE, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "NEURON_LAB_BACKEND": "off"})
    assert r.out.strip().splitlines()[-1] == "refused: RuntimeError", (r.out, r.err[-2000:])


def test_backend_off_leaves_no_device_and_doctor_fails():
    r = run(argv=[str(BIN / "python"), "-m", "neuron_lab", "doctor"], env={"NEURON_LAB_BACKEND": "off"})
    assert r.rc == 1, r.err  # doctor's status answers "is there a neuron device?"
    d = doctor_lines(r.out)
    assert d["torch"].endswith("PrivateUse1 is 'privateuseone'")  # nothing was registered
    assert d["backend"] == "none: NEURON_LAB_BACKEND=off"
    assert d["devices"] == "none (no neuron backend is active: NEURON_LAB_BACKEND=off)"
    assert d["problems"] == "none"


def test_configuration_problems_are_noted_and_auto_is_used(tmp_path):
    """An unknown NEURON_LAB_BACKEND and a torch-neuronx whose metadata has no Version: warnings, not crashes."""
    site = make_site(tmp_path, None, entry_points=False)
    r = run("import torch\n" + PROBE, site=site, env={"NEURON_LAB_BACKEND": "cuda"})
    s = r.json()
    problems = ["NEURON_LAB_BACKEND='cuda' is not one of auto, emulator, off; using auto",
                "torch-neuronx is installed but its metadata has no Version (a broken install?); "
                "treating it as the legacy XLA library"]
    assert s["kind"] == "emulator" and s["device"] == "neuron:0" and s["problems"] == problems
    for p in problems:
        assert f"RuntimeWarning: neuron_lab: {p} (run `neuron-lab doctor` for details)" in r.err


def test_failed_activation_warns_and_doctor_lists_the_problem():
    """The emulator cannot install (NEURON_LAB_CORE=compiled, no compiled core): `import torch` and doctor still
    work, with a warning."""
    r = run(probe_after("""
        import sys
        sys.modules["neuron_lab.backend.emulator._core"] = None  # as an install built without a compiler
        import torch
    """, DOCTOR_IN_PROCESS, doctor="doctor", rc="rc"), env={"NEURON_LAB_CORE": "compiled"})
    s = r.json()
    assert s["rc"] == 1 and s["kind"] == "none" and s["problems"] == [INSTALL_FAILURE]
    assert f"RuntimeWarning: neuron_lab: {INSTALL_FAILURE} (run `neuron-lab doctor` for details)" in r.err
    d = doctor_lines(s["doctor"])
    assert d["torch"].startswith("2.")  # torch imported and works
    assert d["backend"] == f"none: {INSTALL_FAILURE}"
    assert problems_of(s["doctor"]) == [INSTALL_FAILURE]


def test_bad_values_of_the_settings_read_later_warn_at_import_and_the_defaults_are_used():
    """NEURON_LAB_ABORTS and _COMPILE_LOWERING are read at each call or compile, _EMULATE_DOWNCAST at install: each
    bad value is a problem as soon as the device installs, naming the accepted values and the one used instead."""
    bad = {"NEURON_LAB_EMULATE_DOWNCAST": "maybe", "NEURON_LAB_ABORTS": "loud", "NEURON_LAB_COMPILE_LOWERING": "fast"}
    r = run(probe_after("import torch\n", downcast="_runtime.get().emulate_downcast"), env=bad)
    s = r.json()
    problems = ["NEURON_LAB_EMULATE_DOWNCAST='maybe' is not one of 1, true, 0, false; using 1",
                "NEURON_LAB_ABORTS='loud' is not one of warn, raise, off; using warn",
                "NEURON_LAB_COMPILE_LOWERING='fast' is not one of eager, inductor; using eager"]
    assert s["kind"] == "emulator" and s["device"] == "neuron:0" and s["problems"] == problems
    assert s["downcast"] is True
    for p in problems:
        assert f"RuntimeWarning: neuron_lab: {p} (run `neuron-lab doctor` for details)" in r.err


@pytest.mark.parametrize("var", ["NEURON_LAB_COVERAGE", "NEURON_LAB_PROFILE"])
def test_a_bad_coverage_setting_is_a_problem_and_the_default_is_used(var):
    """As every other setting of the emulator: a coverage that does not load warns and the device keeps working."""
    r = run(argv=[str(BIN / "neuron-lab"), "doctor"], env={var: "/nonexistent/p.json"})
    problem = (f"{var}: no coverage '/nonexistent/p.json': not a bundled coverage (torchneuron-2.33, "
               "torchneuron-combined, torchneuron-src-2026-04) nor a file; using torchneuron-combined")
    assert r.rc == 0 and problems_of(r.out) == [problem]
    assert f"RuntimeWarning: neuron_lab: {problem} (run `neuron-lab doctor` for details)" in r.err
    assert doctor_lines(r.out)["backend"].startswith("emulator")


def test_a_coverage_setting_naming_an_op_torch_lacks_is_used_and_a_problem(tmp_path):
    """Walkthrough 48 point 1: the file loads (an export may name another torch's ops), and its unknown op is one of
    the emulator's problems, warned once and listed by doctor, rather than a warning that `-W error` would raise."""
    import json

    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"schema_version": 1, "name": "mine", "source": "s", "date": "d",
                                "ops": {"aten::atan22": {"kind": "fallback"}}}))
    r = run(argv=[str(BIN / "neuron-lab"), "doctor"], env={"NEURON_LAB_COVERAGE": str(path)})
    assert r.rc == 0 and len(problems_of(r.out)) == 1
    problem = problems_of(r.out)[0]
    assert problem.startswith(f"NEURON_LAB_COVERAGE: {path}: 1 op unknown to torch 2.")
    assert problem.endswith(", whose rules never apply here: 'aten::atan22' (did you mean 'aten::atan2'?)")
    assert f"RuntimeWarning: neuron_lab: {problem} (run `neuron-lab doctor` for details)" in r.err
    assert doctor_lines(r.out)["coverage"].startswith(f"mine ({path})")


def test_a_bad_capacity_setting_is_a_problem_and_the_default_is_used():
    r = run(argv=[str(BIN / "neuron-lab"), "doctor"], env={"NEURON_LAB_DEVICE_MEMORY": "garbage"})
    problem = ("NEURON_LAB_DEVICE_MEMORY: 'garbage' is not a size (cannot read 'garbage' as a size (examples: 24GiB, "
               "512MiB, 1048576)); using 24.00 GiB")
    assert r.rc == 0 and problems_of(r.out) == [problem]
    assert f"RuntimeWarning: neuron_lab: {problem} (run `neuron-lab doctor` for details)" in r.err
    assert doctor_lines(r.out)["devices"].endswith("capacity 24.00 GiB per device")


def test_autoload_hook_never_raises():
    """Fault injection into our own code (nothing of torch is replaced): whatever fails, the hook returns."""
    r = run("""
        import json, warnings
        import torch
        import neuron_lab.backend as backend
        from neuron_lab.backend import autoload

        def broken():
            raise KeyError("boom")

        backend.activate = broken
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = autoload._autoload()
        print(json.dumps({"result": result, "ran": autoload.ran, "problems": backend.state().problems,
                          "warnings": [f"{w.category.__name__}: {w.message}" for w in caught]}))
    """, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    s = r.json()
    assert s["result"] is None and s["ran"] is True
    assert s["problems"] == ["autoload failed: KeyError: 'boom'"]
    assert s["warnings"] == ["RuntimeWarning: neuron_lab: the neuron backend did not load (KeyError: 'boom'); "
                             "run `neuron-lab doctor` for details"]


def test_privateuse1_taken_by_another_backend_keeps_neuron_lab_off():
    r = run(probe_after("""
        import torch
        torch.utils.rename_privateuse1_backend("foo")
        import neuron_lab
    """, DOCTOR_IN_PROCESS, doctor="doctor", rc="rc"), env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    s = r.json()
    reason = "PrivateUse1 already belongs to the 'foo' backend; neuron_lab stays off"
    assert s["kind"] == "none" and s["reason"] == reason and s["owner"] == "foo"
    assert s["active"] == f"unavailable: no neuron backend is active: {reason}"
    assert s["module"] is None and s["problems"] == [] and "Warning" not in r.err
    assert s["rc"] == 1
    d = doctor_lines(s["doctor"])
    assert d["torch"].endswith("PrivateUse1 is 'foo'")
    assert d["backend"] == f"none: {reason}"
    assert d["autoload"] == "disabled by TORCH_DEVICE_BACKEND_AUTOLOAD=0; `import neuron_lab` installs the backend"



# -- broken torch-neuronx installs: `import torch` still works, and doctor says why there is no backend -------------
# With autoload on, PyTorch imports the package itself through its torch.backends entry point and reports (or
# dies of) its failure, which no code of neuron_lab can change. With autoload off and `import neuron_lab`, every
# import of torch_neuronx in the process is neuron_lab's, and that one must never raise.
AUTOLOAD_OFF = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}


def broken_site(tmp_path, prelude: str | None = None, metadata_bytes: bytes | None = None):
    """The fake site whose torch_neuronx runs ``prelude`` first thing at import, or whose METADATA is replaced."""
    site = make_site(tmp_path)
    if prelude is not None:
        init = site / "torch_neuronx" / "__init__.py"
        future = "from __future__ import annotations\n"
        init.write_text(init.read_text().replace(future, future + textwrap.dedent(prelude), 1))
    if metadata_bytes is not None:
        meta = next(site.glob("*.dist-info")) / "METADATA"
        meta.write_bytes(meta.read_bytes().replace(b"Summary: ", b"Summary: " + metadata_bytes, 1))
    return site


LOAD_FAILED = "torch-neuronx 2.14.3.0 is installed, but loading it failed: "
UNREADABLE = ("torch-neuronx is installed but its metadata cannot be read (UnicodeDecodeError: 'utf-8' codec can't "
              "decode byte 0xff in position {pos}: invalid start byte); reinstall it")


@pytest.mark.parametrize(("prelude", "metadata_bytes", "problem"), [
    ("import sys\nsys.exit(3)\n", None, LOAD_FAILED + "importing torch_neuronx called sys.exit(3)"),
    ("import sys\nsys.exit()\n", None, LOAD_FAILED + "importing torch_neuronx called sys.exit(None)"),
    ("raise KeyboardInterrupt\n", None,
     LOAD_FAILED + "importing torch_neuronx raised KeyboardInterrupt (no Ctrl-C was pressed)"),
    ("raise ImportError('libnrt.so.1: cannot open shared object file')\n", None,
     LOAD_FAILED + "ImportError: libnrt.so.1: cannot open shared object file"),
    (None, b"\xff\xfe caf\xe9 ", UNREADABLE),
], ids=["sys.exit(3)", "sys.exit()", "KeyboardInterrupt", "ImportError", "METADATA not UTF-8"])
def test_a_broken_torchneuronx_never_breaks_import_torch(tmp_path, prelude, metadata_bytes, problem):
    site = broken_site(tmp_path, prelude, metadata_bytes)
    r = run("import torch\nimport neuron_lab\nprint('ok', torch.ones(2).sum().item())", site=site, env=AUTOLOAD_OFF)
    assert (r.rc, r.out) == (0, "ok 2.0\n"), r.err
    assert "Traceback" not in r.err and "Failed to load the backend extension" not in r.err
    if metadata_bytes is not None:
        problem = problem.format(pos=next(site.glob("*.dist-info/METADATA")).read_bytes().index(b"\xff"))
    assert f"RuntimeWarning: neuron_lab: {problem} (run `neuron-lab doctor` for details)" in r.err
    doctor = run(argv=[str(BIN / "neuron-lab"), "doctor"], site=site, env=AUTOLOAD_OFF)
    assert doctor.rc == 1 and "Traceback" not in doctor.err  # no neuron device, and doctor says why
    d = doctor_lines(doctor.out)
    assert d["torch"].startswith("2.")
    assert d["backend"].startswith(f"none: {problem}")
    assert d["devices"].startswith(f"none (no neuron backend is active: {problem}")
    assert problems_of(doctor.out) == [problem]


def test_an_unreadable_torchneuronx_install_still_allows_the_emulator_when_asked(tmp_path):
    site = broken_site(tmp_path, metadata_bytes=b"\xff ")
    s = run("import torch\nimport neuron_lab\n" + PROBE, site=site,
            env={"NEURON_LAB_BACKEND": "emulator", **AUTOLOAD_OFF}).json()
    assert s["kind"] == "emulator" and s["device"] == "neuron:0"
    assert len([p for p in s["problems"] if "torch-neuronx is installed but its metadata cannot be read" in p]) == 1


def test_a_ctrl_c_pressed_while_torchneuronx_imports_still_interrupts(tmp_path):
    """Only a KeyboardInterrupt the package raised by itself is a problem for doctor: a real SIGINT stops the import,
    as the user meant."""
    site = broken_site(tmp_path, """\
        import os, signal, time
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(30)
    """)
    r = run("import torch\nimport neuron_lab\nprint('ok')", site=site, env=AUTOLOAD_OFF, timeout=60)
    assert r.rc != 0 and r.out == "" and "KeyboardInterrupt" in r.err
    assert "no Ctrl-C was pressed" not in r.err


def test_warnings_as_errors_do_not_break_import_torch(tmp_path):
    site = broken_site(tmp_path, "import sys\nsys.exit(3)\n")
    r = run(argv=[str(BIN / "python"), "-W", "error", "-c", "import torch\nimport neuron_lab\nprint('ok')"], site=site,
            env=AUTOLOAD_OFF)
    assert (r.rc, r.out) == (0, "ok\n"), r.err
