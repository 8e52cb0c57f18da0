"""``%neuron ranks start N --engines ssh --ssh-hosts H1,H2``: engines on hosts reached over SSH, started by
ipyparallel's own ``SSHEngineSetLauncher``.

The launcher takes ``engines`` as ipyparallel spells it, a count per host (``{"node1": 2, "user@node2:2222": 2}``),
copies the connection files to each host (``scp``), starts each engine with ``nohup`` over ``ssh`` and, at stop,
signals it over ``ssh`` again. A remote engine inherits nothing from the notebook, so each is given what a local
engine would have inherited that matters here: ``PYTHONPATH``, neuron_lab's registered variables and the settings
the ranks must agree on, as the notebook has them, and the index of its host (:data:`HOST_INDEX`), by which its rank
is counted (host by host, in the order given).
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass

from neuron_lab import settings
from neuron_lab.session.preflight import must_agree

HOST_INDEX = settings.env("NEURON_LAB_SSH_HOST").name
NEED_HOSTS = "ssh engines need their hosts: `--engines ssh --ssh-hosts node1,node2`"


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
