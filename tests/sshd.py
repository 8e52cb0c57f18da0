"""An sshd for the tests that start engines over ssh: ``tools/ssh_local.sh`` starts one on port 2222 of 127.0.0.1 and
of this machine's non-loopback addresses (``.ci/run`` runs it). Skipped where none answers, and failed in CI, where a
missing sshd is a broken setup."""

from __future__ import annotations

import ipaddress
import subprocess

import psutil
import pytest
from browser import in_ci

PORT = 2222
HOSTS = (f"localhost:{PORT}", f"127.0.0.1:{PORT}")  # two ssh hosts that are this machine: two emulated hosts
MISSING = (f"no sshd answers on {{host}}:{PORT} (`apt-get install -y openssh-server openssh-client` and "
           "`tools/ssh_local.sh`)")


def _skip(why: str) -> None:
    if in_ci():
        pytest.fail(f"CI never skips the ssh tests: {why}", pytrace=False)
    pytest.skip(why)


def _answers(host: str) -> None:
    """Skip (fail in CI) unless ``ssh`` to ``host`` answers without a question."""
    missing = MISSING.format(host=host)
    try:
        done = subprocess.run(["ssh", "-p", str(PORT), "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", host,
                               "true"], capture_output=True, text=True, timeout=30)
        why = "" if done.returncode == 0 else f"{missing}: {done.stderr.strip()}"
    except (OSError, subprocess.TimeoutExpired) as e:
        why = f"{missing}: {e}"
    if why:
        _skip(why)


def hosts() -> str:
    """``--ssh-hosts`` for two hosts; skip (fail in CI) when ``ssh`` to either does not answer without a question."""
    for host in ("localhost", "127.0.0.1"):
        _answers(host)
    return ",".join(HOSTS)


def non_loopback() -> str:
    """This machine's first non-loopback IPv4 address, at which its sshd answers: skipped on a machine with none (a
    fact of the machine, even in CI), failed in CI where the sshd does not answer there."""
    found = [a.address for addrs in psutil.net_if_addrs().values() for a in addrs
             if a.family.name == "AF_INET" and not ipaddress.ip_address(a.address).is_loopback]
    if not found:
        pytest.skip("this machine has no non-loopback IPv4 address to start ssh engines at")
    _answers(found[0])
    return found[0]
