"""Where each rank runs, as the scheduler that started its process says, never from engine ids.

Slurm's ``srun`` (``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NTASKS``, ``SLURM_NODEID``), Open MPI's ``mpirun``
(``OMPI_COMM_WORLD_RANK``/``_SIZE``/``_LOCAL_RANK``/``_LOCAL_SIZE``) and torchrun (``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``) each say which rank a process is; ipyparallel's engines
started by its MPI or Slurm launcher inherit them. Processes nothing numbered (local or SSH engines) are ranked host
by host, in the order their hosts were first seen. The ranks then get torchrun's variables (:func:`rank_env`), with
``MASTER_ADDR`` the host of rank 0, one NeuronCore each in ``NEURON_RT_VISIBLE_CORES`` (TorchNeuron's process group
takes exactly one per process) and ``NEURON_RT_ROOT_COMM_ID`` (``host:port`` of rank 0, the runtime's collectives
bootstrap) set alike on every rank.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from neuron_lab import settings

_HOST = settings.env("NEURON_LAB_HOST")
HOST_ENV = _HOST.name
ROOT_COMM_ENV = settings.env("NEURON_RT_ROOT_COMM_ID").name

SLURM, MPI, TORCHRUN, HOSTS = "slurm", "mpi", "torchrun", "hosts"  # who numbered the ranks
_SLURM_NODE_TASKS = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")  # one item of SLURM_STEP_TASKS_PER_NODE: "2" or "2(x3)"


class PlacementError(ValueError):
    """The processes do not make one world: ranks missing or twice, or sizes that disagree."""


@dataclass(frozen=True)
class Seen:
    """One process as it reported itself: its host name and its environment (the scheduler's variables)."""

    host: str
    env: Mapping[str, str]


@dataclass(frozen=True)
class Place:
    """One rank's place in the world."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node: int  # torchrun's GROUP_RANK: the index of its host
    nnodes: int
    host: str
    source: str  # SLURM, MPI, TORCHRUN or HOSTS


def _int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name, "")
    return int(raw) if raw.isascii() and raw.isdigit() else None


def slurm_tasks_per_node(text: str) -> list[int]:
    """``"2(x3),1"`` -> [2, 2, 2, 1], as Slurm writes ``SLURM_STEP_TASKS_PER_NODE``."""
    out: list[int] = []
    for part in text.split(","):
        m = _SLURM_NODE_TASKS.match(part.strip())
        if not m:
            raise PlacementError(f"SLURM_STEP_TASKS_PER_NODE={text!r}: {part!r} is not N or N(xM)")
        out.extend([int(m[1])] * int(m[2] or 1))
    return out


def _scheduled(seen: Seen) -> tuple[str, int, int, int, int | None, int | None] | None:
    """(source, rank, world size, local rank, local world size or None, node or None) from the scheduler's
    variables, the first set of Slurm, Open MPI and torchrun that is complete; None when none is."""
    env = seen.env
    rank, size, local = _int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS"), _int(env, "SLURM_LOCALID")
    if None not in (rank, size, local):
        node = _int(env, "SLURM_NODEID")
        per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
        local_size = None
        if per_node and node is not None:
            counts = slurm_tasks_per_node(per_node)
            local_size = counts[node] if node < len(counts) else None
        return SLURM, rank, size, local, local_size, node  # type: ignore[return-value]
    rank, size = _int(env, "OMPI_COMM_WORLD_RANK"), _int(env, "OMPI_COMM_WORLD_SIZE")
    local = _int(env, "OMPI_COMM_WORLD_LOCAL_RANK")
    if None not in (rank, size, local):
        return MPI, rank, size, local, _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE"), None  # type: ignore[return-value]
    rank, size, local = _int(env, "RANK"), _int(env, "WORLD_SIZE"), _int(env, "LOCAL_RANK")
    if None not in (rank, size, local):
        return (TORCHRUN, rank, size, local, _int(env, "LOCAL_WORLD_SIZE"),  # type: ignore[return-value]
                _int(env, "GROUP_RANK"))
    return None


def place(seen: Sequence[Seen]) -> list[Place]:
    """Each process's place, in the order given; PlacementError when they do not make ranks 0..N-1 of one world.

    Nodes the scheduler does not number (Open MPI) are numbered in the order of their lowest rank; local world sizes
    it does not give are counted per host."""
    marks = [_scheduled(s) for s in seen]
    if all(m is None for m in marks):
        return _by_host(seen)
    if any(m is None for m in marks):
        raise PlacementError("some processes were started by a scheduler and some not: "
                             f"{sum(m is None for m in marks)} of {len(seen)} have no rank variables")
    n = len(seen)
    ranks = sorted(m[1] for m in marks)  # type: ignore[index]
    if ranks != list(range(n)):
        raise PlacementError(f"{n} processes should be ranks 0..{n - 1}, but they say {ranks}")
    sizes = {m[2] for m in marks}  # type: ignore[index]
    if sizes != {n}:
        raise PlacementError(f"{n} processes, but their world size says {sorted(sizes)}")
    by_rank = sorted(range(n), key=lambda i: marks[i][1])  # type: ignore[index]
    hosts = list(dict.fromkeys(seen[i].host for i in by_rank))  # in order of their lowest rank
    on_host = {h: sum(s.host == h for s in seen) for h in hosts}
    out = []
    for s, (source, rank, size, local, local_size, node) in zip(seen, marks, strict=True):  # type: ignore[misc]
        out.append(Place(rank, local, size, local_size or on_host[s.host],
                         hosts.index(s.host) if node is None else node, len(hosts), s.host, source))
    return out


def _by_host(seen: Sequence[Seen]) -> list[Place]:
    """Processes nothing numbered: host by host in the order the hosts were first seen, in order within a host."""
    hosts = list(dict.fromkeys(s.host for s in seen))
    order = sorted(range(len(seen)), key=lambda i: hosts.index(seen[i].host))  # stable: order within a host stays
    rank_of = {i: r for r, i in enumerate(order)}
    out = []
    for i, s in enumerate(seen):
        mine = [j for j in order if seen[j].host == s.host]
        out.append(Place(rank_of[i], mine.index(i), len(seen), len(mine), hosts.index(s.host), len(hosts), s.host,
                         HOSTS))
    return out


def one_host(nproc: int, host: str = "127.0.0.1", nnodes: int = 1) -> list[Place]:
    """torchrun's own mapping of ``nnodes`` × ``nproc`` ranks: node ``k`` holds ranks ``k*nproc .. k*nproc+nproc-1``
    (all on ``host`` unless the hosts are emulated)."""
    world = nproc * nnodes
    return [Place(r, r % nproc, world, nproc, r // nproc, nnodes, host, TORCHRUN) for r in range(world)]


def emulated_host(node: int) -> str:
    """The name of emulated host ``node`` of a cluster emulated on one machine (``--nnodes``, ``--hosts``)."""
    return f"host{node}"


def host_name(env: Mapping[str, str] | None = None) -> str:
    """The host a rank is on: its emulated host's name where the launcher gave it one, else the machine's."""
    return _HOST.text(env) or socket.gethostname()


def core_of(p: Place, host_cores: Sequence[int] | None = None) -> int:
    """The one NeuronCore rank ``p`` takes: its local rank's place among the cores its host may use (all of them,
    numbered from 0, unless the scheduler gave the job a ``NEURON_RT_VISIBLE_CORES`` of its own)."""
    if host_cores is None:
        return p.local_rank
    if p.local_rank >= len(host_cores):
        raise PlacementError(f"rank {p.rank} is local rank {p.local_rank} on {p.host}, which has only "
                             f"{len(host_cores)} NeuronCores for this job")
    return host_cores[p.local_rank]


def rank_env(p: Place, master_addr: str, master_port: int, root_comm_port: int,
             host_cores: Sequence[int] | None = None) -> dict[str, str]:
    """torchrun's variables for rank ``p`` (``master_addr`` is rank 0's host), its NeuronCore and the group's
    ``NEURON_RT_ROOT_COMM_ID``."""
    return {"RANK": str(p.rank), "LOCAL_RANK": str(p.local_rank), "WORLD_SIZE": str(p.world_size),
            "LOCAL_WORLD_SIZE": str(p.local_world_size), "GROUP_RANK": str(p.node), "GROUP_WORLD_SIZE": str(p.nnodes),
            "ROLE_RANK": str(p.rank), "ROLE_WORLD_SIZE": str(p.world_size), "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port), "NEURON_RT_VISIBLE_CORES": str(core_of(p, host_cores)),
            ROOT_COMM_ENV: f"{master_addr}:{root_comm_port}"}
