"""`make demo` executes the quickstart notebook headless: the exact command the Makefile runs, run here."""

from __future__ import annotations

import ast
import json
import os
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest
from conftest import wheel_without_core

ROOT = Path(__file__).resolve().parents[1]


def _dry_run(target: str, *, assume: tuple[str, ...] = ("-o", ".venv/.installed")) -> str:
    """What `make TARGET` would run (by default the venv counts as installed), also from inside `make test`."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    return subprocess.run(["make", "--no-print-directory", "-n", *assume, target], cwd=ROOT,
                          capture_output=True, text=True, check=True, env=env).stdout


def _demo_command() -> str:
    """The recipe `make demo` runs, as make prints it (the venv counts as installed)."""
    out = _dry_run("demo")
    (line,) = [x for x in out.splitlines() if "neuron-lab run" in x]
    return line


def test_make_demo_runs_the_quickstart_and_leaves_its_outputs_in_out(tmp_path):
    command = _demo_command()
    assert shlex.split(command)[:3] == [".venv/bin/neuron-lab", "run", "notebooks/01_quickstart.ipynb"]
    # the same relative paths, from a directory whose out/ is this test's own
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    (tmp_path / "notebooks").symlink_to(ROOT / "notebooks")
    r = subprocess.run(command, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "aten::atan2" in r.stdout and "summary" in r.stdout.lower()
    nb = nbformat.read(tmp_path / "out" / "01_quickstart.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.execution_count for c in code) and any(c.outputs for c in code)
    html = (tmp_path / "out" / "01_quickstart.html").read_text(encoding="utf-8")
    assert "<html" in html and "aten::atan2" in html
    data = json.loads((tmp_path / "out" / "01_quickstart.json").read_text(encoding="utf-8"))
    assert data["schema"] == "neuron_lab.run/1" and data["exit_code"] == 0


def test_make_lab_opens_jupyterlab_on_the_notebooks():
    assert _dry_run("lab").strip().splitlines() == [".venv/bin/jupyter lab notebooks/"]
    version = subprocess.run([str(ROOT / ".venv/bin/jupyter"), "lab", "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.strip()[0].isdigit(), version.stderr


def test_jupyterlab_is_the_lab_extra_which_the_venv_installs():
    """A kernel-only install (VS Code on a Trn instance) gets no JupyterLab; `make` installs it for `make lab`."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    setup_py = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))  # the dependencies live there (the torch pin)
    (deps,) = [ast.literal_eval(n.value) for n in setup_py.body
               if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "DEPENDENCIES"]
    assert deps and not [d for d in deps if d.lower().startswith("jupyterlab")]
    assert project["optional-dependencies"]["lab"] == ["jupyterlab"]
    install = _dry_run(".venv/.installed", assume=("-W", "pyproject.toml"))  # as after an edit of pyproject.toml
    (line,) = [x for x in install.splitlines() if " -e " in x]
    assert line.endswith("-e '.[test,lab,docs]'"), line


def test_make_docs_executes_every_notebook_then_builds_the_site_strictly():
    """The site shows each notebook as `neuron-lab run` left it, and a broken internal link fails the build."""
    lines = _dry_run("docs").replace("\\\n", " ").splitlines()
    runs = [shlex.split(x)[:3] for x in lines if "neuron-lab run" in x]
    notebooks = sorted(f"notebooks/{p.name}" for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert runs == [[".venv/bin/neuron-lab", "run", nb] for nb in notebooks], runs
    assert [x for x in lines if "mkdocs" in x] == ["NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict"]


def test_make_test_reports_its_slowest_tests():
    """Both pytest runs of `make test` end with the 15 slowest tests, so a slow one is seen where it is added; they
    run side by side, one per core, each waiting on kernels and subprocesses while the other computes."""
    lines = _dry_run("test").replace("\\\n", " ").splitlines()
    runs = [x for x in lines if " -m pytest " in x]
    assert len(runs) == 2 and all("--durations=15" in shlex.split(x) for x in runs), runs
    assert sorted("NEURON_LAB_CORE=python" in x for x in runs) == [False, True], runs
    (passes,) = [shlex.split(x) for x in lines if "test-compiled-core" in x]
    assert "-j2" in passes and "test-python-core" in passes, passes


def test_make_wheel_builds_against_the_venvs_torch_and_wheel_check_checks_that_wheel():
    """Built into build/wheel, then tagged manylinux into dist/ by `auditwheel repair`, torch's libraries excluded."""
    lines = _dry_run("wheel").replace("\\\n", " ").splitlines()
    (build,) = [shlex.split(x) for x in lines if " wheel " in x and "auditwheel" not in x]
    assert build[:3] == ["MAX_JOBS=2", ".venv/bin/pip", "wheel"] and build[-1] == "."
    assert {"--no-build-isolation", "--no-deps"} <= set(build) and build[build.index("-w") + 1] == "build/wheel"
    (repair,) = [shlex.split(x) for x in lines if "auditwheel" in x]
    assert repair[1:3] == [".venv/bin/auditwheel", "repair"] and repair[-1] == "build/wheel/neuron_lab-*.whl"
    assert repair[repair.index("-w") + 1] == "dist"
    assert [repair[i + 1] for i, a in enumerate(repair) if a == "--exclude"] == ["libtorch*.so", "libc10.so"]
    (check,) = [x for x in _dry_run("wheel-check").splitlines() if "check_wheel" in x]
    assert shlex.split(check) == ["PYTHON=.venv/bin/python", "tools/check_wheel.sh", "dist/neuron_lab-*.whl"]


def test_the_wheel_check_fails_a_wheel_without_the_compiled_core(tmp_path):
    """`make wheel-check`'s script on a wheel built without the core (NEURON_LAB_BUILD_CORE=0): installed where no
    compiler is, it loads and runs on the pure-Python core, and the check says so and fails. Such a wheel is pure,
    requires the torch range the pure-Python core supports and carries no core record."""
    wheel, _ = wheel_without_core(tmp_path)
    assert wheel.name == "neuron_lab-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as z:
        meta = z.read("neuron_lab-0.1.0.dist-info/METADATA").decode()
        assert not [n for n in z.namelist() if "emulator/_core" in n]
    assert "Requires-Dist: torch<2.15,>=2.13" in meta.splitlines()
    check = subprocess.run([str(ROOT / "tools" / "check_wheel.sh"), str(wheel)], cwd=tmp_path, capture_output=True,
                           text=True, timeout=300, env={**os.environ, "PYTHON": sys.executable})
    assert check.returncode != 0, check.stdout
    assert "AssertionError: the python core serves `neuron`: the wheel's compiled core is missing or did not load" \
        in check.stderr, check.stderr[-3000:]
