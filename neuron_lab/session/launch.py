"""The environment of each rank, as torchrun gives it to its workers: ``neuron-lab run --nproc N``'s kernels and
``%neuron ranks start N``'s engines alike.

torchrun (``torch.distributed.run``, one node, ``--nproc-per-node N``) starts N workers with these; a script
reads ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``, ``init_process_group`` the ``MASTER_*`` rendezvous, and the
emulator ``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` to give each rank its own ``neuron:{LOCAL_RANK}``. As torchrun's
elastic agent does, the launcher hosts the rendezvous store (:class:`AgentStore`) and every rank is its client
(``TORCHELASTIC_USE_AGENT_STORE=True``).
"""

from __future__ import annotations

import uuid

MASTER_ADDR = "127.0.0.1"


class AgentStore:
    """The ranks' rendezvous store, hosted by the launcher for as long as this object lives.

    The OS picks its port as it starts listening, so no other process can take the port between its choice and its
    use; a free port chosen first for rank 0 to listen on later can be taken (a CI run failed with EADDRINUSE)."""

    def __init__(self) -> None:
        from torch.distributed import TCPStore

        self._store = TCPStore(MASTER_ADDR, 0, is_master=True, wait_for_workers=False)
        self.port: int = self._store.port


def rank_envs(base: dict[str, str], nproc: int, port: int) -> list[dict[str, str]]:
    """``base`` plus torchrun's variables for each of ``nproc`` ranks on one node, in rank order, whose rendezvous is
    an :class:`AgentStore` listening on ``port``.

    Like torchrun, ``OMP_NUM_THREADS`` becomes 1 when several ranks share the machine and it is not set.
    """
    run_id = uuid.uuid4().hex[:12]
    common = {"WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1",
              "ROLE_NAME": "default", "ROLE_WORLD_SIZE": str(nproc), "MASTER_ADDR": MASTER_ADDR,
              "MASTER_PORT": str(port), "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
              "TORCHELASTIC_RUN_ID": run_id, "TORCHELASTIC_USE_AGENT_STORE": "True"}
    if nproc > 1 and "OMP_NUM_THREADS" not in base:
        common["OMP_NUM_THREADS"] = "1"
    return [{**base, **common, "RANK": str(r), "LOCAL_RANK": str(r), "ROLE_RANK": str(r)} for r in range(nproc)]
