"""The address at which the ranks reach the notebook: its rendezvous store (``MASTER_ADDR``, the host of
``NEURON_RT_ROOT_COMM_ID``) and its ipyparallel controller.

Engines that all run on this machine (local, mpi, emulated hosts, ssh hosts named by a loopback name) reach it on
loopback, as before. Others need an address their hosts can reach: ``NeuronLab.ranks_address`` (else
``NEURON_LAB_RANKS_ADDRESS``) when set; for ssh engines the address of this machine's interface that routes to the
first host not named by loopback (a UDP socket's ``connect``, which sends nothing); for Slurm, whose nodes are
unknown until the job starts, ``socket.getfqdn()``.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence

from neuron_lab import settings

LOOPBACK = "127.0.0.1"
_ADDRESS = settings.env("NEURON_LAB_RANKS_ADDRESS")
_PROBE_PORT = 22  # any port: a UDP connect only picks the route


def choose(chosen: str, engines: str, ssh_hosts: Sequence[str] = ()) -> str:
    """The address the ranks reach the notebook at: ``chosen`` (the setting), else the variable, else the rule above
    for ``engines`` started on ``ssh_hosts`` (host names without user or port)."""
    if chosen.strip() or _ADDRESS.text():
        return chosen.strip() or _ADDRESS.text()
    if engines == "slurm":
        return socket.getfqdn()
    remote = [h for h in ssh_hosts if not is_loopback(h)] if engines == "ssh" else []
    return route_to(remote[0]) if remote else LOOPBACK


def route_to(host: str) -> str:
    """This machine's address on the interface that routes to ``host``; ``socket.getfqdn()`` when no route or
    name resolves."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((host, _PROBE_PORT))
            return str(s.getsockname()[0])
    except OSError:
        return socket.getfqdn()


def ip_of(address: str) -> str:
    """``address`` as an IP address (a name resolved), for the controller to listen on; OSError if it resolves to
    none."""
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return socket.gethostbyname(address)


def is_loopback(address: str) -> bool:
    """Whether ``address`` (an IP or a name) is this machine's loopback; a name that does not resolve is not."""
    try:
        return ipaddress.ip_address(ip_of(address)).is_loopback
    except (OSError, ValueError):
        return False
