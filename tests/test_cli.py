"""`neuron-lab doctor` and `neuron-lab coverage`, run as a user runs them."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``neuron-lab ARGS`` as its console script runs it (``_neuron_lab_cli``: help answers before torch loads)."""
    return subprocess.run([sys.executable, "-m", "_neuron_lab_cli", *args], capture_output=True, text=True,
                          timeout=120, env=env, cwd=ROOT)


def test_doctor_reports_backend_devices_coverage_and_env():
    r = run("doctor")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "backend      emulator: torch-neuronx is not installed: using the bundled emulator" in out
    assert "devices      4 (neuron:0..neuron:3); capacity 24.00 GiB per device" in out  # a trn2.3xlarge
    assert "coverage     torchneuron-combined" in out
    assert "NEURON_LAB_DEVICE_MEMORY" in out and "TORCH_DEVICE_BACKEND_AUTOLOAD" in out
    assert "problems     none" in out


def test_doctor_on_the_emulator_says_what_the_torchneuron_lines_are(tmp_path):
    """TorchNeuron's settings are listed apart and said to be unread here; the build line and neuron-ls say what
    they are; a neuron-ls on PATH is run (with a timeout) and its output shown."""
    import os

    out = run("doctor", env={**os.environ, "PATH": str(tmp_path)}).stdout  # no neuron-ls anywhere on PATH
    assert "  build        emulator (no TorchNeuron build)" in out
    assert "  neuron-ls    not on PATH (the Neuron tools come with the Neuron SDK on Trn instances)" in out
    section = out.split("  TorchNeuron settings (not read by the emulator)\n", 1)[1].split("  problems", 1)[0]
    names = [line.split()[0] for line in section.splitlines()]
    assert "NEURON_LAUNCH_BLOCKING" in names and "TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS" in names
    assert "NEURON_LAUNCH_BLOCKING" not in out.split("  TorchNeuron settings", 1)[0]  # not among neuron_lab's own
    assert "TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION" not in names  # the emulator reads it: listed with its own
    assert "TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION" in out.split("  TorchNeuron settings", 1)[0]
    tool = tmp_path / "neuron-ls"
    tool.write_text("#!/bin/sh\necho 'NEURON DEVICE 0: held by pid 4242'\n")
    tool.chmod(0o755)
    out = run("doctor", env={**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}).stdout
    assert f"  neuron-ls    {tool} (exit 0)\n    NEURON DEVICE 0: held by pid 4242\n" in out


def test_coverage_show_lists_fallbacks_and_rejects_unknown():
    r = run("coverage", "show")
    assert r.returncode == 0
    assert "fallback  aten::atan2" in r.stdout and "host      aten::_linalg_svd" in r.stdout
    bad = run("coverage", "show", "no-such-coverage")
    assert bad.returncode == 2 and "no coverage 'no-such-coverage'" in bad.stderr


def test_coverage_export_round_trips(tmp_path):
    f = tmp_path / "live.json"
    r = run("coverage", "export", str(f), "--name", "live")
    assert r.returncode == 0, r.stderr
    data = json.loads(f.read_text())
    assert data["name"] == "live" and data["default"]["kind"] == "fallback"
    assert data["ops"]["aten::add"]["kind"] == "native"  # the emulator registers add directly
    shown = run("coverage", "show", str(f))
    assert shown.returncode == 0 and "live" in shown.stdout


def test_the_package_runs_without_jupyterlab():
    """JupyterLab is the `lab` extra: no module of neuron_lab imports it, the extension loads and the CLI runs."""
    code = textwrap.dedent("""
        import importlib, pkgutil, sys
        for blocked in ("jupyterlab", "jupyter_server", "notebook"):
            sys.modules[blocked] = None  # importing it raises ImportError, as when it is not installed
        import neuron_lab
        for m in pkgutil.walk_packages(neuron_lab.__path__, "neuron_lab."):
            if m.name != "neuron_lab.__main__":
                importlib.import_module(m.name)
        from IPython.core.interactiveshell import InteractiveShell
        InteractiveShell.instance().run_line_magic("load_ext", "neuron_lab")
        from neuron_lab.cli import main
        sys.exit(main(["doctor"]))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "neuron_lab" in r.stdout and "problems     none" in r.stdout


def test_help_ends_with_example_commands_that_the_real_parser_accepts():
    from neuron_lab import cli
    from neuron_lab.runner import main, options

    top, sub = run("--help"), run("run", "--help")
    assert top.returncode == sub.returncode == 0
    assert top.stdout.endswith("\nexamples:\n" + options.examples(cli.EXAMPLES))
    assert sub.stdout.endswith("\nexamples:\n" + options.examples(options.EXAMPLES))
    assert ("\n  neuron-lab run nb.ipynb --fail-on-fallback --allow-fallback normal  # CI: no CPU fallback but normal\n"
            in sub.stdout)
    assert max(len(line) for line in sub.stdout.partition("\nexamples:\n")[2].splitlines()) <= 110
    for command, _ in cli.EXAMPLES + options.EXAMPLES:
        argv = shlex.split(command)[1:]
        args = cli.build_parser().parse_args(argv)
        assert args.command == argv[0], command
        if argv[0] == "run":
            own = ("command", "func", "in_kernels", "parser")  # the top parser's defaults for the subcommand
            assert vars(main.parser().parse_args(argv[1:])) == {k: v for k, v in vars(args).items()
                                                                 if k not in own}, command


CONSOLE_SCRIPT = ("-c", "import sys, _neuron_lab_cli\nsys.argv[0] = 'neuron-lab'\nsys.exit(_neuron_lab_cli.main())")


@pytest.mark.parametrize("launch", [CONSOLE_SCRIPT, ("-m", "neuron_lab")], ids=["neuron-lab", "python-m"])
def test_the_command_line_answers_help_version_and_bad_usage_before_torch_loads(tmp_path, launch):
    """``neuron-lab`` (``_neuron_lab_cli``) and ``python -m neuron_lab`` parse before ``import neuron_lab`` has
    imported torch: only a command that uses the device here imports it; ``run``'s cells run in kernels, so its own
    process never does. ``-X importtime`` lists every module the process imports, on stderr."""
    script = tmp_path / "train.py"
    script.write_text("import torch\nx = torch.ones(2, device='neuron') * 2\n")
    for args, rc, torch_loaded in ((["--version"], 0, False), (["run", "--help"], 0, False),
                                   (["run", "nb.ipynb", "--timeout", "nan"], 2, False),
                                   (["run", str(script), "--json", str(tmp_path / "run.json")], 0, False),
                                   (["coverage", "show", "no-such-coverage"], 2, True)):
        r = subprocess.run([sys.executable, "-X", "importtime", *launch, *args], capture_output=True, text=True,
                           timeout=120, cwd=ROOT)
        timed = [line for line in r.stderr.splitlines() if line.startswith("import time:")]
        imported = {line.rpartition("|")[2].strip() for line in timed}
        assert (r.returncode, "torch" in imported) == (rc, torch_loaded), (args, r.stdout, r.stderr[-3000:])
    said = [line for line in r.stderr.splitlines() if not line.startswith("import time:")]
    assert said[0].startswith("neuron-lab coverage show: no coverage 'no-such-coverage'"), said
