"""A Slurm job of engines as the notebook sees it: the options it was asked with, and its state.

Engines in a Slurm job are not processes of the notebook's machine, so they are not watched by pid: the job's state
(``squeue``, then ``sacct`` once it left the queue) says whether they can be running; an engine that dies inside a
running job is told by the controller, which stops hearing its heartbeat.
"""

from __future__ import annotations

import shlex
import subprocess
import time
from dataclasses import dataclass

CHECK_S = 2.0  # the job's state is asked of Slurm at most this often (a waiting notebook polls more often)
ASK_TIMEOUT_S = 10.0  # squeue/sacct answer within this, or the state is unknown
UP = ("PENDING", "CONFIGURING", "RUNNING")  # states in which the job's engines are, or are about to be, up
GONE_WAIT_S = 30.0  # after scancel, the job leaves these states within this


@dataclass(frozen=True)
class SlurmOptions:
    """``%neuron ranks start N --engines slurm``'s options, named as ``sbatch`` names them."""

    partition: str | None = None
    nodes: int | None = None
    ntasks_per_node: int | None = None
    account: str | None = None
    time: str | None = None

    def traits(self) -> dict[str, str]:
        """The values of ``SlurmEngineSetLauncher``'s traits (``queue``, ``account``, ``timelimit``, ``options``)."""
        extra = [f"--{name}={value}" for name, value in (("nodes", self.nodes),
                                                         ("ntasks-per-node", self.ntasks_per_node))
                 if value is not None]
        traits = {"queue": self.partition, "account": self.account, "timelimit": self.time,
                  "options": " ".join(extra) or None}
        return {k: v for k, v in traits.items() if v is not None}

    def flags(self) -> str:
        """As the magic's options, for a command to paste again."""
        given = (("partition", self.partition), ("nodes", self.nodes), ("ntasks-per-node", self.ntasks_per_node),
                 ("account", self.account), ("time", self.time))
        return "".join(f" --{name} {shlex.quote(str(value))}" for name, value in given if value is not None)


def job_state(job_id: str) -> str | None:
    """The job's state (``RUNNING``, ``CANCELLED``, ...), from ``squeue`` while Slurm keeps it there, else from
    ``sacct``; None when neither knows it."""
    for command in (["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"],
                    ["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"]):
        try:
            out = subprocess.run(command, capture_output=True, text=True, timeout=ASK_TIMEOUT_S, check=False).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        words = out.split()
        if words:
            return words[0]  # sacct writes "CANCELLED by 0"
    return None


class JobWatch:
    """One job's state, asked of Slurm at most every :data:`CHECK_S` seconds."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self._state: str | None = "PENDING"
        self._asked = float("-inf")

    def state(self, fresh: bool = False) -> str | None:
        """The job's state, as Slurm said it within :data:`CHECK_S` (``fresh``: as it says now)."""
        if fresh or time.monotonic() - self._asked >= CHECK_S:
            self._state, self._asked = job_state(self.job_id), time.monotonic()
        return self._state

    def up(self, fresh: bool = False) -> bool:
        """Whether its engines can be running: a job no longer known (None) cannot."""
        return self.state(fresh) in UP

    def gone(self, timeout_s: float = GONE_WAIT_S) -> bool:
        """Wait until the job has left the running states (after ``scancel``); whether it did in time."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if job_state(self.job_id) not in (*UP, "COMPLETING"):
                return True
            time.sleep(0.5)
        return False

    def ended_outside(self, restart: str) -> str:
        """What to say when the job ended without the notebook stopping it."""
        self.gone()  # a cancelled job is COMPLETING until its processes ended: its final state says why
        state = self.state(fresh=True) or "unknown to squeue and sacct"
        how = "was cancelled" if state.startswith("CANCELLED") else "ended"
        return f"the Slurm job {self.job_id} {how} outside the notebook (state {state}): `{restart}`"
