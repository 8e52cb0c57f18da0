"""``%neuron ranks start N --engines ssh --ssh-hosts H1,H2``: engines on hosts reached over SSH, started by
ipyparallel's own ``SSHEngineSetLauncher``.

The launcher takes ``engines`` as ipyparallel spells it, a count per host (``{"node1": 2, "user@node2:2222": 2}``),
copies the connection files to each host (``scp``) and starts each engine with ``nohup`` over ``ssh``. A remote
engine inherits nothing from the notebook, so each is given what a local engine would have inherited that matters
here: ``PYTHONPATH``, neuron_lab's registered variables and the settings the ranks must agree on, as the notebook has
them, and the index of its host (:data:`HOST_INDEX`), by which its rank is counted (host by host, in the order given).

At stop :func:`kill` ends them with one ``ssh`` per host, the hosts at once: the launcher's own stop takes a TERM, a
wait and an output fetch per engine, one after another (30-40 s for 4 engines).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from neuron_lab import settings
from neuron_lab.session.preflight import must_agree

HOST_INDEX = settings.env("NEURON_LAB_SSH_HOST").name
NEED_HOSTS = "ssh engines need their hosts: `--engines ssh --ssh-hosts node1,node2`"

# run on a host by its Python (psutil: ipyparallel's own need): kill each engine (argv[2:]) and its children (its nanny,
# in a session of its own) and print the pids still there after argv[1] seconds
_KILL = """import sys, psutil
procs = []
for pid in map(int, sys.argv[2:]):
    try:
        p = psutil.Process(pid)
        procs += [p, *p.children(recursive=True)]
    except psutil.NoSuchProcess:
        pass
for p in procs:
    try:
        p.kill()
    except psutil.NoSuchProcess:
        pass
print(*sorted(p.pid for p in psutil.wait_procs(procs, timeout=float(sys.argv[1]))[1]))
"""


def _host_name(key: str) -> str:
    """``user@node:2222`` -> ``node``, as the launcher splits its ``engines`` keys."""
    return key.rpartition("@")[2].split(":", 1)[0]


@dataclass(frozen=True)
class SSHOptions:
    """The hosts, each as ipyparallel's ``engines`` key (``[user@]host[:port]``); each runs this kernel's Python, at
    the same path."""

    hosts: tuple[str, ...]

    @classmethod
    def parse(cls, hosts: str) -> SSHOptions:
        """``--ssh-hosts node1,node2``; ValueError says what is wrong."""
        names = tuple(h.strip() for h in hosts.split(","))
        if not all(names):
            raise ValueError(f"{hosts!r} has an empty host name")
        if len(set(names)) != len(names):
            raise ValueError(f"{hosts!r} names a host twice; give each host once")
        return cls(names)

    def check(self, n: int) -> None:
        """ValueError unless the ``n`` ranks divide evenly over the hosts (as many ranks on each)."""
        if n % len(self.hosts):
            raise ValueError(f"the {n} ranks do not divide evenly over the {len(self.hosts)} ssh hosts (as many "
                             "ranks on each host)")

    def host_name(self, index: int) -> str:
        """Host ``index`` as a person names it (no user, no port)."""
        return _host_name(self.hosts[index])

    def traits(self, n: int, profile_dir: str) -> dict[str, object]:
        """``SSHEngineSetLauncher``'s traits for ``n`` engines, ``n // len(hosts)`` per host: each host's engines
        with the notebook's settings and their host's index, and a profile folder of their own (two hosts that are
        this machine would otherwise copy the connection files onto themselves)."""
        ours = {v.name for v in settings.listed()}
        inherited = {k: v for k, v in os.environ.items() if k == "PYTHONPATH" or k in ours or must_agree(k)}
        engines = {host: {"n": n // len(self.hosts), "environment": {**inherited, HOST_INDEX: str(i)},
                          "remote_profile_dir": os.path.join(profile_dir, f"ssh{i}")}
                   for i, host in enumerate(self.hosts)}
        return {"engines": engines, "remote_python": sys.executable,
                "ssh_args": ["-o", "BatchMode=yes"], "scp_args": ["-o", "BatchMode=yes"]}

    def flags(self) -> str:
        """As the magic's options, for a command to paste again."""
        return f" --ssh-hosts {shlex.quote(','.join(self.hosts))}"


def kill(engine_sets: Iterable[Any], timeout_s: float) -> list[str]:
    """Kill the running engines of ipyparallel's ``SSHEngineSetLauncher`` s in ``engine_sets`` (others are left as
    they are) with one ``ssh`` per host, the hosts at once, each waiting up to ``timeout_s`` for its engines and
    their nannies to be gone; what is not gone, in words (empty: all of them).

    Each launcher is marked stopped first, its output taken as empty: nothing shows an ssh engine's output file, and
    fetching it costs an ``ssh`` and an ``scp`` per engine; marked first, the launcher's own wait thread, which sees
    its engine end, finds it stopped already."""
    from ipyparallel.cluster.launcher import SSHEngineSetLauncher

    hosts: dict[tuple[str, ...], list[int]] = {}  # the ssh command that reaches a host -> its engines' pids
    for es in engine_sets:
        if not isinstance(es, SSHEngineSetLauncher):
            continue
        for el in list(es.launchers.values()):
            if el.state != "running":
                continue
            hosts.setdefault((*el.ssh_cmd, *el.ssh_args, el.location, el.remote_python), []).append(el.pid)
            el._output = ""  # noqa: SLF001 (the launcher's cache of its output: taken as fetched, and empty)
            if getattr(el, "_stop_waiting", None) is not None:
                el._stop_waiting.set()  # noqa: SLF001 (its wait thread ends at its next look)
            el.notify_stop({"exit_code": None, "pid": el.pid, "identifier": el.identifier})

    def one(host: tuple[str, ...]) -> str:
        *ssh, location, python = host
        pids = hosts[host]
        remote = shlex.join([python, "-c", _KILL, str(timeout_s), *map(str, pids)])
        try:
            done = subprocess.run([*ssh, location, remote], capture_output=True, text=True, timeout=timeout_s + 15)
        except subprocess.TimeoutExpired:
            return f"{location}: no answer to the kill of pids {pids} in {timeout_s + 15:g} s"
        if done.returncode:
            return f"{location}: the kill of pids {pids} failed: {done.stderr.strip() or done.returncode}"
        left = done.stdout.split()
        return f"{location}: pids {', '.join(left)} still running {timeout_s:g} s after their kill" if left else ""

    with ThreadPoolExecutor(max(1, len(hosts))) as pool:
        return [said for said in pool.map(one, hosts) if said]
