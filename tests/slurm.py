"""Slurm for the tests that start engines through it: the default partition of a Slurm that answers here
(``tools/slurm_local.sh`` starts a one-machine Slurm; ``.ci/run`` runs it). Skipped where none answers, and failed in
CI, where a missing Slurm is a broken setup."""

from __future__ import annotations

import subprocess

import pytest
from browser import in_ci

MISSING = "no Slurm answers here (`apt-get install -y slurm-wlm munge` and, as root, `tools/slurm_local.sh`)"


def default_partition() -> str:
    """The partition ``sinfo`` marks as default; skip (fail in CI) when Slurm does not answer or has none up."""
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%P %a"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        out, why = "", f"{MISSING}: {e}"
    else:
        why = MISSING
    up = [name.rstrip("*") for name, avail in (line.split() for line in out.splitlines()) if avail == "up"
          and name.endswith("*")]
    if up:
        return up[0]
    if in_ci():
        pytest.fail(f"CI never skips the Slurm tests: {why}", pytrace=False)
    pytest.skip(why)
