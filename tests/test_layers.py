"""The import-layers contract (`lint-imports`, configured in pyproject.toml) holds, and it catches a breach.

`make test` runs `lint-imports` itself; these tests show the contract is not vacuous: a copy of the
package with one upward import, or one cycle, fails it with a message naming the import.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT = Path(sys.executable).with_name("lint-imports")


def lint(tree: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run([str(LINT), str(tree / "pyproject.toml"), "--no-cache", "--no-logo"], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """The package's Python sources and the contract, in a directory of their own."""
    shutil.copytree(ROOT / "neuron_lab", tmp_path / "neuron_lab", ignore=shutil.ignore_patterns("*.so", "__pycache__",
                                                                                               "csrc", "*.json"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_package_keeps_its_layers() -> None:
    proc = lint(ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "Contracts: 3 kept, 0 broken." in proc.stdout


def breached(copy: Path, *imports: tuple[str, str]) -> str:
    """Add each ``(module file, imported module)`` as a late import in ``copy``; the failing contract's output."""
    for module, imported in imports:
        path = copy / "neuron_lab" / module
        path.write_text(path.read_text() + f"\n\ndef _late():\n    import {imported}  # noqa\n")
    proc = lint(copy)
    assert proc.returncode == 1, proc.stdout[-2000:]
    return proc.stdout


def test_an_upward_import_breaks_the_layers(copy: Path) -> None:
    out = breached(copy, ("backend/events.py", "neuron_lab.session"))
    assert "neuron_lab.backend is not allowed to import neuron_lab.session" in out
    assert "- neuron_lab.backend.events -> neuron_lab.session" in out


def test_siblings_never_import_each_other(copy: Path) -> None:
    """checks and widgets are siblings in one layer: neither may import the other."""
    out = breached(copy, ("widgets/snapshot.py", "neuron_lab.checks"))
    assert "neuron_lab.widgets is not allowed to import neuron_lab.checks" in out


def test_the_in_kernel_agent_imports_neither_the_magics_nor_ipython(copy: Path) -> None:
    """The agent both launchers call by name runs in any kernel or engine: it is handed the shell."""
    out = breached(copy, ("agent.py", "IPython.display"), ("agent.py", "neuron_lab.extension"))
    assert "neuron_lab.agent is not allowed to import IPython" in out
    assert "neuron_lab.agent is not allowed to import neuron_lab.extension" in out


def test_the_report_glue_is_the_one_allowed_cycle(copy: Path) -> None:
    """A model importing its renderer is allowed; any other cycle inside the report package is not."""
    out = breached(copy, ("report/aggregate.py", "neuron_lab.report.text"),
                   ("report/text.py", "neuron_lab.report.aggregate"))
    assert "No cycles are allowed in neuron_lab.report" in out
