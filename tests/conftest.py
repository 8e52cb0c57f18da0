"""Shared fixtures and marks: a real IPython shell with the extension loaded, a fresh interpreter for behaviour
fixed at process start (environment variables), and the `slow` mark on the modules that start kernels, ranks, browsers
or `make` (`make test-fast` leaves them out)."""

from __future__ import annotations

import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def shell() -> Any:
    """A real IPython shell with the extension loaded (``tests/shells.py``), unloaded and emptied afterwards.

    What is left once its teardown has collected the test's cycles (the shell itself, which IPython's ``atexit``
    keeps, the modules and compile caches the test brought in: ``torch._dynamo`` and ``torch._inductor`` alone are
    some 170k objects) is then frozen like what collection built, so that later collections, in teardowns and in tests,
    walk only what each test makes (0.15-0.7 s a full collection otherwise, growing through a worker's run)."""
    from shells import loaded_shell

    with loaded_shell() as sh:
        yield sh
    gc.freeze()


@pytest.fixture
def b() -> Iterator[Any]:
    """The active backend, synchronized, with its op tracking cleared before and after the test and the default
    coverage restored after it: tests that count ops see only their own."""
    from neuron_lab import backend
    from neuron_lab.backend import coverage

    nb = backend.active()
    nb.synchronize()
    nb.clear_op_tracking()
    yield nb
    nb.set_coverage(coverage.DEFAULT_COVERAGE)
    nb.clear_op_tracking()


@pytest.fixture
def run_python() -> Callable[..., Any]:
    """Run ``code`` in a new interpreter with extra environment variables; return the JSON it prints last.

    The emulator reads NEURON_LAB_DEVICE_MEMORY and NEURON_LAB_EMULATE_DOWNCAST once, when it installs,
    so tests of those settings need a process of their own.
    """

    def run(code: str, env: dict[str, str], timeout: float = 60) -> Any:
        proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env={**os.environ, **env},
                              capture_output=True, text=True, timeout=timeout)
        assert proc.returncode == 0, f"child failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}"
        return json.loads(proc.stdout.strip().splitlines()[-1])

    return run


# Each of these starts Jupyter kernels, ranks, Chromium or `make`, or sweeps PyTorch's OpInfo or ModuleInfo database.
# They run first, in this order: the longest work that cannot be split first (a module run whole on one worker, see
# ONE_WORKER, then single tests of 15-35 s), by their durations on the compiled core at -n 2 (2026-12), so that what
# xdist hands out last is short.
SLOW_MODULES = ("test_ranks", "test_dashboard_browser", "test_browser_rig", "test_runner_ranks", "test_checkup",
                "test_make", "test_ranks_slurm", "test_widgets_kernel", "test_dashboard_ranks", "test_ranks_attach",
                "test_ranks_ssh", "test_ranks_multihost", "test_out_conformance", "test_notebooks", "test_distributed",
                "test_runner", "test_opinfo_conformance", "test_opinfo64_conformance", "test_moduleinfo_conformance",
                "test_runner_trace", "test_kernel_notebook")
# Not slow as a whole, but with single tests of 10-25 s (fresh interpreters, the TorchNeuron stand-in, a group's
# stand-in run): after the slow modules and before the others, so that none of them is handed out last.
LONG_TESTS_MODULES = ("test_upstream_agreement", "test_workbench_on_torchneuron", "test_extension_on_torchneuron",
                      "test_cores", "test_docs", "test_memory_reading", "test_cli", "test_memory_snapshot",
                      "test_torch_neuronx", "test_syncs", "test_waits", "test_profiler", "test_profile_on_torchneuron")
_ORDER = {name: i for i, name in enumerate(SLOW_MODULES + LONG_TESTS_MODULES)}

# The modules whose tests share what a worker starts once for them (a module's rank group, a notebook's kernel, a
# stand-in's run; the session's JupyterLab and Chromium): `make test` hands each group whole to one worker, so it
# starts once, not once on each worker that xdist would otherwise spread the group's tests over.
ONE_WORKER = {"test_ranks": "ranks", "test_dashboard_ranks": "dashboard_ranks", "test_ranks_attach": "ranks_attach",
              "test_ranks_slurm": "ranks_slurm", "test_ranks_ssh": "ranks_ssh", "test_widgets_kernel": "widgets_kernel",
              "test_kernel_notebook": "kernel_notebook", "test_memory_reading": "memory_reading",
              "test_torchneuron_adapter": "torchneuron_adapter", "test_browser_rig": "browser",
              "test_dashboard_browser": "browser", "test_profile_timeline": "browser"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the slow modules' tests, and run them first, in SLOW_MODULES' order, then LONG_TESTS_MODULES: a 20-40 s
    test that xdist hands out last keeps one worker busy while the other idles. The sort is stable, so each module's
    tests stay together (module fixtures start once per worker) and in their order. The pure-Python pass of ``make
    test`` leaves out the tests marked ``core_in_child``: their children run the core the test names (or the TorchNeuron
    stand-in, whose children get no ``NEURON_LAB_`` variables) whatever the pass, so the compiled pass has run exactly
    them."""
    if os.environ.get("NEURON_LAB_CORE") == "python":
        same = [item for item in items if item.get_closest_marker("core_in_child")]
        if same:
            config.hook.pytest_deselected(items=same)
            items[:] = [item for item in items if not item.get_closest_marker("core_in_child")]
    for item in items:
        if _rank(item) < len(SLOW_MODULES):
            item.add_marker(pytest.mark.slow)
    items.sort(key=_rank)


def _rank(item: pytest.Item) -> int:
    """Where the item's module comes in SLOW_MODULES, then LONG_TESTS_MODULES; after them all for the others."""
    module = item.module.__name__.rpartition(".")[2] if item.module is not None else ""
    return _ORDER.get(module, len(_ORDER))


@pytest.hookimpl(optionalhook=True)  # xdist's hook: `-p no:xdist` runs the suite without it
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` with the groups of ``ONE_WORKER``: each worker gets the next test, or the next whole group,
    whenever it runs low, in collection order (the slow modules first). The groups are told by module here, in the
    controller: ``xdist_group`` marks would not reach it (under pytest 9.2 xdist's worker can no longer add a mark's
    group to the node id it reports)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByModuleGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = Path(nodeid.partition("::")[0]).stem
            return ONE_WORKER.get(module, nodeid)

    return ByModuleGroup(config, log)


def pytest_report_header(config: pytest.Config) -> str:
    """Which emulator core this run tests (``make test`` runs the backend tests on both)."""
    return f"neuron_lab emulator core requested: {os.environ.get('NEURON_LAB_CORE', 'auto')}"


def core() -> str:
    """The core serving `neuron` in this test process: "compiled" or "python"."""
    import neuron_lab  # noqa: F401  (installs the backend)
    from neuron_lab.backend.emulator import runtime

    return runtime.get().core


def neuron_lab_run(tmp: Path, *args: str, timeout: float = 240) -> tuple[int, str]:
    """``neuron-lab run ARGS`` in ``tmp``, in a new process (and session: past ``timeout`` it dies with its kernels);
    its exit code and output."""
    env = {**os.environ, "IPYTHONDIR": str(tmp / "ipython")}
    proc = subprocess.Popen([sys.executable, "-m", "_neuron_lab_cli", "run", *args], cwd=tmp, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"neuron-lab run still running after {timeout}s:\n{out[-4000:]}")
    return proc.returncode, out


ROOT = Path(__file__).resolve().parent.parent
STARTUP = ("neuron_lab-torch_neuronx.pth", "_neuron_lab_torch_neuronx.py")  # what the wheel puts in site-packages


def wheel_without_core(tmp: Path) -> tuple[Path, Path]:
    """(a wheel of the package built without the compiled core, the copy of the sources it was built from): a copy,
    so the build never writes into the tree other tests import from."""
    src, out = tmp / "src", tmp / "wheel"
    shutil.copytree(ROOT / "neuron_lab", src / "neuron_lab", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    for name in ("setup.py", "pyproject.toml", "MANIFEST.in", "README.md", "_neuron_lab_cli.py", *STARTUP):
        shutil.copy(ROOT / name, src / name)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(src),
                           "-w", str(out)], env={**os.environ, "NEURON_LAB_BUILD_CORE": "0"},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = out.glob("neuron_lab-*.whl")
    return wheel, src


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Once a module's last test has torn down the module's fixtures, collect what the module left and freeze the
    rest, as collection's freeze and the ``shell`` fixture do: the next modules' collections (their tests', their
    shells', the automatic ones) walk only what they make."""
    yield
    if nextitem is None or nextitem.module is not item.module:
        gc.collect()
        gc.freeze()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what collection built (PyTorch's OpInfo and ModuleInfo databases, torch, IPython): the many tests
    that ``gc.collect()`` to settle device memory then walk only what tests made since (0.2 s less per call)."""
    gc.collect()
    gc.freeze()
