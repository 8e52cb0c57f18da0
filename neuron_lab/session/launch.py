"""The environment of each rank, as torchrun gives it to its workers: ``neuron-lab run --nproc N``'s kernels and
``%neuron ranks start N``'s engines alike.

torchrun (``torch.distributed.run``, one node, ``--nproc-per-node N``) starts N workers with these; a script
reads ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``, ``init_process_group`` the ``MASTER_*`` rendezvous, and the
emulator ``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` to give each rank its own ``neuron:{LOCAL_RANK}``. No
elastic agent hosts a store here, so rank 0 hosts it (``TORCHELASTIC_USE_AGENT_STORE=False``), as
``env://`` does without torchrun.
"""

from __future__ import annotations

import socket
import uuid

MASTER_ADDR = "127.0.0.1"


def free_port() -> int:
    """A TCP port free on the loopback now, for rank 0's store."""
    with socket.socket() as s:
        s.bind((MASTER_ADDR, 0))
        return s.getsockname()[1]


def rank_envs(base: dict[str, str], nproc: int, port: int | None = None) -> list[dict[str, str]]:
    """``base`` plus torchrun's variables for each of ``nproc`` ranks on one node, in rank order.

    Like torchrun, ``OMP_NUM_THREADS`` becomes 1 when several ranks share the machine and it is not set.
    """
    port = free_port() if port is None else port
    run_id = uuid.uuid4().hex[:12]
    common = {"WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1",
              "ROLE_NAME": "default", "ROLE_WORLD_SIZE": str(nproc), "MASTER_ADDR": MASTER_ADDR,
              "MASTER_PORT": str(port), "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
              "TORCHELASTIC_RUN_ID": run_id, "TORCHELASTIC_USE_AGENT_STORE": "False"}
    if nproc > 1 and "OMP_NUM_THREADS" not in base:
        common["OMP_NUM_THREADS"] = "1"
    return [{**base, **common, "RANK": str(r), "LOCAL_RANK": str(r), "ROLE_RANK": str(r)} for r in range(nproc)]
