"""Helpers for tests that need a `torch-neuronx` installed: the fake site, and fresh interpreters to run it in.

Backend choice is fixed once per process (PrivateUse1 is claimed at ``import torch``), so every
scenario runs in a child interpreter with a clean environment.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from procs import default_sigint

SITE = Path(__file__).parent / "site"
_DIST = SITE / "torch_neuronx-2.14.3.0.dist-info"
BIN = Path(sys.executable).parent
# Settings a developer's shell may carry that would change what a child process decides.
_SCRUB = ("PYTHONPATH", "TORCH_DEVICE_BACKEND_AUTOLOAD")
_SCRUB_PREFIXES = ("NEURON_LAB_", "TORCH_NEURONX_", "NEURON_RT_")
# Children run in an empty directory: the repository root holds neuron_lab.egg-info, and the
# current directory heads sys.path, which would put neuron_lab's entry points first in every child.
_CWD = tempfile.mkdtemp(prefix="neuron-lab-child-")


def make_site(tmp_path: Path, version: str | None = "2.14.3.0", entry_points: bool = True) -> Path:
    """A copy of the fake site that declares ``version`` (None: a METADATA without a Version line).

    The legacy XLA library is modelled without entry points.
    """
    site = tmp_path / f"site-{version}"
    shutil.copytree(SITE / "torch_neuronx", site / "torch_neuronx", ignore=shutil.ignore_patterns("__pycache__"))
    dist = site / f"torch_neuronx-{version or 'unknown'}.dist-info"
    dist.mkdir()
    meta = (_DIST / "METADATA").read_text().replace("Version: 2.14.3.0\n", f"Version: {version}\n" if version else "")
    (dist / "METADATA").write_text(meta)
    if entry_points:
        shutil.copy(_DIST / "entry_points.txt", dist / "entry_points.txt")
    (dist / "RECORD").write_text("")
    return site


@dataclass
class Result:
    rc: int
    out: str
    err: str

    def json(self) -> Any:
        """The JSON object the child printed on its last stdout line."""
        assert self.rc == 0, f"child failed (rc {self.rc}):\n{self.err[-4000:]}"
        return json.loads(self.out.strip().splitlines()[-1])


def child_env(env: dict[str, str] | None = None, site: Path | None = None) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in _SCRUB and not k.startswith(_SCRUB_PREFIXES)}
    base["PYTHONDONTWRITEBYTECODE"] = "1"
    base["PYTHONPATH"] = os.pathsep.join([str(site)] * (site is not None) + [str(Path(__file__).parents[2])])
    return {**base, **(env or {})}


def run(code: str | None = None, *, env: dict[str, str] | None = None, site: Path | None = None,
        site_last: bool = False, argv: list[str] | None = None, timeout: float = 120) -> Result:
    """Run ``code`` (or ``argv``) in a fresh interpreter.

    ``site`` goes first on the path through PYTHONPATH, or with ``site_last`` is appended to
    ``sys.path`` before the code runs, after the virtual environment's site-packages.
    """
    if argv is None:
        code = textwrap.dedent(code or "")
        if site is not None and site_last:
            code = f"import sys\nsys.path.append({str(site)!r})\n" + code
            site = None
        argv = [sys.executable, "-c", code]
    proc = subprocess.run(argv, env=child_env(env, site), cwd=_CWD, capture_output=True, text=True, timeout=timeout,
                          preexec_fn=default_sigint)  # a Ctrl-C test's child is interruptible from a background job
    return Result(proc.returncode, proc.stdout, proc.stderr)
