"""The environment of each rank, as torchrun gives it to its workers: ``neuron-lab run --nproc N``'s kernels and
``%neuron ranks start N``'s engines alike.

torchrun (``torch.distributed.run``, one node, ``--nproc-per-node N``) starts N workers with these; a script
reads ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``, ``init_process_group`` the ``MASTER_*`` rendezvous, and the
emulator ``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` to give each rank its own ``neuron:{LOCAL_RANK}``; each rank also gets
its one NeuronCore and the group's ``NEURON_RT_ROOT_COMM_ID`` (``session.placement``). As torchrun's
elastic agent does, the launcher hosts the rendezvous store (:class:`AgentStore`) and every rank is its client
(``TORCHELASTIC_USE_AGENT_STORE=True``).
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from neuron_lab import settings
from neuron_lab.session import placement
from neuron_lab.session.ranks_address import LOOPBACK

MASTER_ADDR = LOOPBACK  # all ranks on this machine; others reach it at `session.ranks_address`
_INSTANCE = settings.env("NEURON_LAB_INSTANCE")


class AgentStore:
    """The ranks' rendezvous store, hosted by the launcher for as long as this object lives.

    The OS picks its port as it starts listening, so no other process can take the port between its choice and its
    use; a free port chosen first for rank 0 to listen on later can be taken (a CI run failed with EADDRINUSE).
    It listens on every interface (TCPStore's server does, whatever its host), so ranks on other hosts reach it at
    ``address``, the ``MASTER_ADDR`` they are given."""

    def __init__(self, address: str = MASTER_ADDR) -> None:
        from torch.distributed import TCPStore

        self.address = address
        self.tcp = TCPStore(address, 0, is_master=True, wait_for_workers=False)
        self.port: int = self.tcp.port


def store_client(env: Mapping[str, str], timeout: float) -> Any:
    """A rank's own client of the group's store, at its environment's ``MASTER_ADDR``/``MASTER_PORT``: the preflight
    check's, and one for each answering thread (``stuck``, ``rank_pulse``), which never shares the main thread's."""
    from torch.distributed import TCPStore

    return TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False, timeout=timedelta(seconds=timeout))


def free_port() -> int:
    """A port nothing listens on now, for ``NEURON_RT_ROOT_COMM_ID``: the Neuron runtime binds it later, as
    TorchNeuron's process group picks one on rank 0 when the variable is unset (free on every interface)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def host_instances(text: str, nnodes: int) -> list[str]:
    """``--instance trn2.48xlarge`` (every emulated host) or ``trn2.48xlarge,trn1.32xlarge`` (one per host, in
    order): each host's instance shape; ValueError says what is wrong."""
    names = [n.strip() for n in text.split(",")]
    bad = [n for n in names if n not in _INSTANCE.choices]
    if bad:
        raise ValueError(f"{bad[0]!r} is not an instance the emulator knows ({', '.join(_INSTANCE.choices)})")
    if len(names) not in (1, nnodes):
        raise ValueError(f"{len(names)} instances for {nnodes} hosts: give one for all, or one per host")
    return names * nnodes if len(names) == 1 else names


def rank_envs(base: dict[str, str], nproc: int, port: int, nnodes: int = 1, instances: Sequence[str] = (),
              master_addr: str = MASTER_ADDR) -> list[dict[str, str]]:
    """``base`` plus torchrun's variables for each of ``nproc`` ranks on each of ``nnodes`` nodes, in rank order,
    whose rendezvous is an :class:`AgentStore` listening on ``port``. Several nodes are hosts emulated on this
    machine: each rank is told its host's name (``NEURON_LAB_HOST``); the rendezvous stays on this machine.

    Like torchrun, ``OMP_NUM_THREADS`` becomes 1 when several ranks share the machine and it is not set.
    ``instances``: each emulated host's instance shape (:func:`host_instances`), so a rank's devices, cores and
    memory are its host's.
    """
    emulated = nnodes > 1 or bool(instances)
    return place_envs(base, placement.one_host(nproc, master_addr, nnodes), port, emulated, instances, master_addr)


def place_envs(base: dict[str, str], places: list[placement.Place], port: int, emulated: bool = False,
               instances: Sequence[str] = (), master_addr: str = MASTER_ADDR) -> list[dict[str, str]]:
    """:func:`rank_envs` for ranks the scheduler placed (in the order of ``places``); ``emulated``: their hosts
    are emulated on this machine, and each rank is told its host's name (and its instance, given ``instances``);
    ``master_addr``: where they reach the store (and the runtime's bootstrap, ``NEURON_RT_ROOT_COMM_ID``)."""
    root_comm_port = free_port()
    common = {"ROLE_NAME": "default", "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
              "TORCHELASTIC_RUN_ID": uuid.uuid4().hex[:12], "TORCHELASTIC_USE_AGENT_STORE": "True"}
    if len(places) > 1 and "OMP_NUM_THREADS" not in base:
        common["OMP_NUM_THREADS"] = "1"
    hosts = [{placement.HOST_ENV: placement.emulated_host(p.node),
              **({_INSTANCE.name: instances[p.node]} if instances else {})} if emulated else {} for p in places]
    return [{**base, **common, **placement.rank_env(p, master_addr, port, root_comm_port), **host}
            for p, host in zip(places, hosts, strict=True)]
