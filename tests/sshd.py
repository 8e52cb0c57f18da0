"""An sshd for the tests that start engines over ssh: ``tools/ssh_local.sh`` starts one on localhost:2222 (``.ci/run``
runs it). Skipped where none answers, and failed in CI, where a missing sshd is a broken setup."""

from __future__ import annotations

import subprocess

import pytest
from browser import in_ci

PORT = 2222
HOSTS = (f"localhost:{PORT}", f"127.0.0.1:{PORT}")  # two ssh hosts that are this machine: two emulated hosts
MISSING = (f"no sshd answers on localhost:{PORT} (`apt-get install -y openssh-server openssh-client` and "
           "`tools/ssh_local.sh`)")


def hosts() -> str:
    """``--ssh-hosts`` for two hosts; skip (fail in CI) when ``ssh`` to either does not answer without a question."""
    for host in ("localhost", "127.0.0.1"):
        try:
            done = subprocess.run(["ssh", "-p", str(PORT), "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", host,
                                   "true"], capture_output=True, text=True, timeout=30)
            why = "" if done.returncode == 0 else f"{MISSING}: {done.stderr.strip()}"
        except (OSError, subprocess.TimeoutExpired) as e:
            why = f"{MISSING}: {e}"
        if why:
            if in_ci():
                pytest.fail(f"CI never skips the ssh tests: {why}", pytrace=False)
            pytest.skip(why)
    return ",".join(HOSTS)
